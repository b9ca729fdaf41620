#pragma once

// The JSON log line of relaybus's processes beside the server
// (relaybus-agent; relaybus-mongo writes the same form):
// {"ts":"2024-01-02T03:04:05.678Z","level":"info","msg":...,<fields>} and a
// newline. Fields come after the three fixed ones (nlohmann's object order:
// sorted by name); a field named ts, level or msg replaces that one. Invalid
// UTF-8 in any text is replaced (U+FFFD), never an exception.

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace relaybus::core {

std::string json_log_line(int64_t unix_ms, std::string_view level, std::string_view msg, const nlohmann::json& fields);

}  // namespace relaybus::core
