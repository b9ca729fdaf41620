#include "core/clock.hpp"
#include "core/json_log.hpp"

#include <gtest/gtest.h>

using relaybus::core::json_log_line;

TEST(JsonLog, OneLineWithTheFixedFieldsAndTheOthers) {
  EXPECT_EQ(json_log_line(1700000000123, "info", "connected", {{"pid", 42}, {"database", "app"}}),
            "{\"database\":\"app\",\"level\":\"info\",\"msg\":\"connected\",\"pid\":42,"
            "\"ts\":\"2023-11-14T22:13:20.123Z\"}\n");
}

TEST(JsonLog, NoFieldsAndNonObjectFields) {
  EXPECT_EQ(json_log_line(0, "warn", "x", nlohmann::json::object()),
            "{\"level\":\"warn\",\"msg\":\"x\",\"ts\":\"1970-01-01T00:00:00.000Z\"}\n");
  EXPECT_EQ(json_log_line(0, "warn", "x", nlohmann::json::array({1, 2})),
            "{\"level\":\"warn\",\"msg\":\"x\",\"ts\":\"1970-01-01T00:00:00.000Z\"}\n");
}

TEST(JsonLog, EscapesAndReplacesInvalidUtf8) {
  const std::string line = json_log_line(0, "error", "a \"quoted\"\nline", {{"error", std::string("bad \xff byte")}});
  EXPECT_EQ(line.find('\n'), line.size() - 1);  // one line: the message's newline is escaped
  EXPECT_NE(line.find("\"msg\":\"a \\\"quoted\\\"\\nline\""), std::string::npos);
  EXPECT_NE(line.find("\"error\":\"bad \xef\xbf\xbd byte\""), std::string::npos);
  EXPECT_TRUE(nlohmann::json::accept(line));
}

TEST(Clock, WallIsUnixMillisecondsAndMonotonicNeverGoesBack) {
  const int64_t wall = relaybus::core::wall_ms();
  EXPECT_GT(wall, int64_t{1700000000000});  // after 2023-11-14
  EXPECT_LT(wall, int64_t{4102444800000});  // before 2100
  int64_t last = relaybus::core::monotonic_ms();
  for (int i = 0; i < 1000; i++) {
    const int64_t now = relaybus::core::monotonic_ms();
    EXPECT_GE(now, last);
    last = now;
  }
}

TEST(JsonLog, LogLevels) {
  relaybus::core::LogLevel level = relaybus::core::LogLevel::Error;
  ASSERT_TRUE(relaybus::core::parse_log_level("debug", &level));
  EXPECT_EQ(level, relaybus::core::LogLevel::Debug);
  ASSERT_TRUE(relaybus::core::parse_log_level("warn", &level));
  EXPECT_EQ(level, relaybus::core::LogLevel::Warn);
  EXPECT_FALSE(relaybus::core::parse_log_level("INFO", &level));
  EXPECT_FALSE(relaybus::core::parse_log_level("", &level));
  EXPECT_EQ(level, relaybus::core::LogLevel::Warn);
}
