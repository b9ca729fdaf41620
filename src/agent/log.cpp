#include "agent/log.hpp"

#include <atomic>
#include <cstdio>

#include "core/clock.hpp"
#include "core/json_log.hpp"

namespace relaybus::agent {

namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::Info)};
constexpr const char* kNames[] = {"debug", "info", "warn", "error"};
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
  const std::string text = core::json_log_line(core::wall_ms(), kNames[static_cast<int>(level)], msg, fields);
  fwrite(text.data(), 1, text.size(), stderr);
  fflush(stderr);
}

}  // namespace relaybus::agent
