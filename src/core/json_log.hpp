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

// The process's log: json_log_line of the wall clock on stderr, one write and
// flush a line, lines below the level set left out (default Info).
enum class LogLevel { Debug, Info, Warn, Error };
bool parse_log_level(std::string_view text, LogLevel* out);  // "debug", "info", "warn", "error"
void set_log_level(LogLevel level);
void log(LogLevel level, std::string_view msg, const nlohmann::json& fields = nlohmann::json::object());
inline void log_debug(std::string_view m, const nlohmann::json& f = nlohmann::json::object()) {
  log(LogLevel::Debug, m, f);
}
inline void log_info(std::string_view m, const nlohmann::json& f = nlohmann::json::object()) {
  log(LogLevel::Info, m, f);
}
inline void log_warn(std::string_view m, const nlohmann::json& f = nlohmann::json::object()) {
  log(LogLevel::Warn, m, f);
}
inline void log_error(std::string_view m, const nlohmann::json& f = nlohmann::json::object()) {
  log(LogLevel::Error, m, f);
}

}  // namespace relaybus::core
