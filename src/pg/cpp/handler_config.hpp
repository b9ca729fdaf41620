// What a handler's catalog entry holds for C++ code (cpp/catalog_cache.h's
// HandlerEntry::config).
#pragma once

#include <string>

#include "core/handler_config.hpp"

namespace relaybus::pg {

struct HandlerConfig {
  std::string target;  // the target as stored (the URL of an http handler)
  core::HandlerOptions options;
};

}  // namespace relaybus::pg
