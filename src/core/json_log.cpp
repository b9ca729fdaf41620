#include "core/json_log.hpp"

#include <atomic>
#include <cstdio>

#include "core/clock.hpp"

#include "core/webhook_delivery.hpp"

namespace relaybus::core {

namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::Info)};
constexpr const char* kLevelNames[] = {"debug", "info", "warn", "error"};
}  // namespace

std::string json_log_line(int64_t unix_ms, std::string_view level, std::string_view msg, const nlohmann::json& fields) {
  nlohmann::json line = nlohmann::json::object();
  line["ts"] = format_rfc3339_ms(unix_ms);
  line["level"] = std::string(level);
  line["msg"] = std::string(msg);
  if (fields.is_object())
    for (auto& [k, v] : fields.items()) line[k] = v;
  std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  text += '\n';
  return text;
}

bool parse_log_level(std::string_view text, LogLevel* out) {
  for (int i = 0; i < 4; i++)
    if (text == kLevelNames[i]) {
      *out = static_cast<LogLevel>(i);
      return true;
    }
  return false;
}

void set_log_level(LogLevel level) { g_level = static_cast<int>(level); }

void log(LogLevel level, std::string_view msg, const nlohmann::json& fields) {
  if (static_cast<int>(level) < g_level.load()) return;
  const std::string text = json_log_line(wall_ms(), kLevelNames[static_cast<int>(level)], msg, fields);
  fwrite(text.data(), 1, text.size(), stderr);
  fflush(stderr);
}

}  // namespace relaybus::core
