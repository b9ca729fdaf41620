#pragma once

// JSON lines on stderr, one object per line ({"ts", "level", "msg", ...fields}),
// the form relaybus-mongo writes.

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace relaybus::agent {

enum class LogLevel { Debug, Info, Warn, Error };
bool parse_log_level(std::string_view text, LogLevel* out);
void set_log_level(LogLevel level);
void log(LogLevel level, std::string_view msg, nlohmann::json fields = nlohmann::json::object());
inline void log_debug(std::string_view m, nlohmann::json f = nlohmann::json::object()) {
  log(LogLevel::Debug, m, std::move(f));
}
inline void log_info(std::string_view m, nlohmann::json f = nlohmann::json::object()) {
  log(LogLevel::Info, m, std::move(f));
}
inline void log_warn(std::string_view m, nlohmann::json f = nlohmann::json::object()) {
  log(LogLevel::Warn, m, std::move(f));
}
inline void log_error(std::string_view m, nlohmann::json f = nlohmann::json::object()) {
  log(LogLevel::Error, m, std::move(f));
}

}  // namespace relaybus::agent
