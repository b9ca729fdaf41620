#pragma once

#include <string>

#include "core/http_engine.hpp"

// The value of the first header named `name` in r, "<none>" when it has none.
inline std::string header(const relaybus::core::HttpRequest& r, const std::string& name) {
  for (const auto& kv : r.headers)
    if (kv.first == name) return kv.second;
  return "<none>";
}
