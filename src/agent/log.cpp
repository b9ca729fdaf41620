#include "agent/log.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>

namespace relaybus::agent {

namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::Info)};
constexpr const char* kNames[] = {"debug", "info", "warn", "error"};

std::string iso8601_ms(int64_t ms) {
  time_t s = static_cast<time_t>(ms / 1000);
  struct tm tm;
  gmtime_r(&s, &tm);
  char buf[64];
  snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
           tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms % 1000));
  return buf;
}
}  // namespace

bool parse_log_level(std::string_view text, LogLevel* out) {
  for (int i = 0; i < 4; i++)
    if (text == kNames[i]) {
      *out = static_cast<LogLevel>(i);
      return true;
    }
  return false;
}

void set_log_level(LogLevel level) { g_level = static_cast<int>(level); }

void log(LogLevel level, std::string_view msg, nlohmann::json fields) {
  if (static_cast<int>(level) < g_level.load()) return;
  nlohmann::json line = nlohmann::json::object();
  line["ts"] = iso8601_ms(wall_ms());
  line["level"] = kNames[static_cast<int>(level)];
  line["msg"] = std::string(msg);
  if (fields.is_object())
    for (auto& [k, v] : fields.items()) line[k] = v;
  std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  text += '\n';
  fwrite(text.data(), 1, text.size(), stderr);
  fflush(stderr);
}

int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t monotonic_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace relaybus::agent
