#include "core/duration.hpp"

#include <gtest/gtest.h>

#include <string>

namespace relaybus::core {
namespace {

int64_t ok(std::string_view text) {
  std::string why;
  auto v = parse_duration_ms(text, &why);
  EXPECT_TRUE(v.has_value()) << '"' << text << "\": " << why;
  return v.value_or(-12345);
}

std::string bad(std::string_view text) {
  std::string why;
  auto v = parse_duration_ms(text, &why);
  EXPECT_FALSE(v.has_value()) << '"' << text << "\" gave " << v.value_or(0);
  EXPECT_FALSE(why.empty());
  return why;
}

TEST(ParseDuration, ExamplesFromTheSpec) {
  EXPECT_EQ(ok("250ms"), 250);
  EXPECT_EQ(ok("2s"), 2000);
  EXPECT_EQ(ok("2 s"), 2000);
  EXPECT_EQ(ok("1.5s"), 1500);
  EXPECT_EQ(ok("5min"), 300000);
  EXPECT_EQ(ok("5 minutes"), 300000);
  EXPECT_EQ(ok("1h"), 3600000);
  EXPECT_EQ(ok("2 hours"), 7200000);
  EXPECT_EQ(ok("1d"), 86400000);
  EXPECT_EQ(ok("1 day"), 86400000);
  EXPECT_EQ(ok("30"), 30000);
  EXPECT_EQ(ok("00:00:05"), 5000);
  EXPECT_EQ(ok("01:02:03.5"), 3723500);
}

TEST(ParseDuration, EveryUnitSpelling) {
  for (const char* u : {"ms", "msec", "msecs", "millisecond", "milliseconds"})
    EXPECT_EQ(ok(std::string("3") + u), 3) << u;
  for (const char* u : {"s", "sec", "secs", "second", "seconds"}) EXPECT_EQ(ok(std::string("3 ") + u), 3000) << u;
  for (const char* u : {"m", "min", "mins", "minute", "minutes"}) EXPECT_EQ(ok(std::string("3") + u), 180000) << u;
  for (const char* u : {"h", "hr", "hrs", "hour", "hours"}) EXPECT_EQ(ok(std::string("3") + u), 10800000) << u;
  for (const char* u : {"d", "day", "days"}) EXPECT_EQ(ok(std::string("3") + u), 259200000) << u;
  for (const char* u : {"w", "week", "weeks"}) EXPECT_EQ(ok(std::string("1") + u), 604800000) << u;
}

TEST(ParseDuration, CaseAndSpaces) {
  EXPECT_EQ(ok("2S"), 2000);
  EXPECT_EQ(ok("5 MiN"), 300000);
  EXPECT_EQ(ok("250MS"), 250);
  EXPECT_EQ(ok("  2s  "), 2000);
  EXPECT_EQ(ok("\t2\ts\n"), 2000);
  EXPECT_EQ(ok(" 30 "), 30000);
}

TEST(ParseDuration, SeveralTermsAddUp) {
  EXPECT_EQ(ok("1h 30min"), 5400000);
  EXPECT_EQ(ok("1h30m"), 5400000);
  EXPECT_EQ(ok("1 day 02:00:00"), 93600000);  // PostgreSQL interval output
  EXPECT_EQ(ok("2 days 00:00:01"), 172801000);
  EXPECT_EQ(ok("0.1s 0.2s"), 300);
}

TEST(ParseDuration, ClockForms) {
  EXPECT_EQ(ok("00:00:00"), 0);
  EXPECT_EQ(ok("0:0:1"), 1000);
  EXPECT_EQ(ok("01:30"), 5400000);  // h:m, as PostgreSQL reads it
  EXPECT_EQ(ok("100:00:00"), 360000000);
  EXPECT_EQ(ok("00:00:00.25"), 250);
  EXPECT_EQ(ok("00:00:00.000123"), 0);  // rounds to the nearest ms
  EXPECT_EQ(ok("00:00:00.0005"), 1);
}

TEST(ParseDuration, FractionsAreExactAndRounded) {
  EXPECT_EQ(ok("0.5ms"), 1);
  EXPECT_EQ(ok("0.4ms"), 0);
  EXPECT_EQ(ok("1.0005s"), 1001);
  EXPECT_EQ(ok("1.0004999s"), 1000);
  EXPECT_EQ(ok("0.001s"), 1);
  EXPECT_EQ(ok("1.5h"), 5400000);
  EXPECT_EQ(ok("0.1d"), 8640000);
  EXPECT_EQ(ok("2.25"), 2250);
  EXPECT_EQ(ok("1.123456789123s"), 1123);  // digits past the 9th ignored
}

TEST(ParseDuration, Zero) {
  EXPECT_EQ(ok("0"), 0);
  EXPECT_EQ(ok("0s"), 0);
  EXPECT_EQ(ok("0ms"), 0);
}

TEST(ParseDuration, Errors) {
  EXPECT_EQ(bad(""), "duration is empty");
  EXPECT_EQ(bad("   "), "duration is empty");
  EXPECT_EQ(bad("-5s"), "negative durations are not allowed (got \"-5s\")");
  EXPECT_EQ(bad("-00:00:05"), "negative durations are not allowed (got \"-00:00:05\")");
  EXPECT_EQ(bad("1 day -02:00:00"), "negative durations are not allowed (got \"1 day -02:00:00\")");
  EXPECT_EQ(bad("abc"), "expected a number at \"abc\"");
  EXPECT_EQ(bad("+5s"), "expected a number at \"+5s\"");
  EXPECT_EQ(bad(".5s"), "expected a number at \".5s\"");
  EXPECT_EQ(bad("5 fortnights"), "unknown unit \"fortnights\" (use ms, s, min, h or d)");
  EXPECT_EQ(bad("5 mon"), "unknown unit \"mon\" (use ms, s, min, h or d)");
  EXPECT_EQ(bad("5us"), "unknown unit \"us\" (use ms, s, min, h or d)");
  EXPECT_EQ(bad("1h 30"), "missing unit after \"30\"");
  EXPECT_EQ(bad("5!"), "expected a unit at \"!\"");
  EXPECT_EQ(bad("5s,"), "expected a number at \",\"");
  EXPECT_EQ(bad("1."), "expected a digit after '.' in \"1.\"");
  EXPECT_EQ(bad("1.s"), "expected a digit after '.' in \"1.s\"");
  EXPECT_EQ(bad("00:60:00"), "minutes must be below 60 (got \"00:60:00\")");
  EXPECT_EQ(bad("00:00:60"), "seconds must be below 60 (got \"00:00:60\")");
  EXPECT_EQ(bad("1:"), "expected h:mm:ss at \"1:\"");
  EXPECT_EQ(bad("1:2:"), "expected h:mm:ss at \"1:2:\"");
  EXPECT_EQ(bad("1:234"), "expected h:mm:ss at \"1:234\"");
  EXPECT_EQ(bad("1:2:3:4"), "expected a number at \":4\"");
}

TEST(ParseDuration, ErrorQuotesAreShortAndSafe) {
  const std::string why = bad("x" + std::string(100, 'y'));
  EXPECT_EQ(why, "expected a number at \"x" + std::string(39, 'y') + "...\"");
  EXPECT_EQ(bad("5 s\x01"), "expected a number at \"?\"");
}

TEST(ParseDuration, Overflow) {
  EXPECT_EQ(ok("9223372036854775807ms"), INT64_MAX);
  EXPECT_EQ(bad("9223372036854775808ms"), "duration is too large (got \"9223372036854775808ms\")");
  EXPECT_EQ(bad("99999999999999999999999"), "duration is too large (got \"99999999999999999999999\")");
  EXPECT_EQ(ok("9223372036854775s"), 9223372036854775000);
  EXPECT_EQ(bad("9223372036854776s"), "duration is too large (got \"9223372036854776s\")");
  EXPECT_EQ(bad("9223372036854775807ms 1ms"), "duration is too large (got \"9223372036854775807ms 1ms\")");
  EXPECT_EQ(bad("9223372036854775807.5ms"), "duration is too large (got \"9223372036854775807.5ms\")");
  EXPECT_EQ(bad("3000000000000:00:00"), "duration is too large (got \"3000000000000:00:00\")");
  EXPECT_EQ(bad("200000000000000w"), "duration is too large (got \"200000000000000w\")");
}

TEST(ParseDuration, NullWhyIsAllowed) {
  EXPECT_FALSE(parse_duration_ms("nope", nullptr).has_value());
  EXPECT_EQ(parse_duration_ms("2s", nullptr).value_or(0), 2000);
}

TEST(FormatDuration, LargestExactUnit) {
  EXPECT_EQ(format_duration_ms(250), "250ms");
  EXPECT_EQ(format_duration_ms(2000), "2s");
  EXPECT_EQ(format_duration_ms(600000), "10min");
  EXPECT_EQ(format_duration_ms(3600000), "1h");
  EXPECT_EQ(format_duration_ms(86400000), "1d");
  EXPECT_EQ(format_duration_ms(1500), "1500ms");
  EXPECT_EQ(format_duration_ms(90000), "90s");
  EXPECT_EQ(format_duration_ms(5400000), "90min");
  EXPECT_EQ(format_duration_ms(604800000), "7d");
  EXPECT_EQ(format_duration_ms(0), "0s");
  EXPECT_EQ(format_duration_ms(1), "1ms");
}

TEST(FormatDuration, Negative) {
  EXPECT_EQ(format_duration_ms(-2000), "-2s");
  EXPECT_EQ(format_duration_ms(INT64_MIN), "-9223372036854775808ms");
}

TEST(FormatDuration, RoundTripsThroughParse) {
  for (int64_t v : {int64_t{0}, int64_t{1}, int64_t{999}, int64_t{1000}, int64_t{1001}, int64_t{59999}, int64_t{60000},
                    int64_t{3599999}, int64_t{3600000}, int64_t{86400000}, int64_t{86400001}, int64_t{7} * 86400000,
                    int64_t{123456789012}, INT64_MAX}) {
    EXPECT_EQ(parse_duration_ms(format_duration_ms(v), nullptr).value_or(-1), v) << v;
  }
}

}  // namespace
}  // namespace relaybus::core
