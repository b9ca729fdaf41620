#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace relaybus::core {

constexpr int64_t kMsPerSecond = 1000;
constexpr int64_t kMsPerMinute = 60 * kMsPerSecond;
constexpr int64_t kMsPerHour = 60 * kMsPerMinute;
constexpr int64_t kMsPerDay = 24 * kMsPerHour;

// Parses "250ms", "2s", "2 s", "1.5s", "5min", "5 minutes", "1h", "2 hours",
// "1d", "1 day", "30" (a plain number alone = seconds) and PostgreSQL interval
// output "00:00:05" / "01:02:03.5" (h:m:s; "h:m" also). Several terms add up,
// so PostgreSQL's "1 day 02:00:00" and "1h 30min" work too.
// Units (case-insensitive): ms, msec(s), millisecond(s); s, sec(s), second(s);
// m, min(s), minute(s); h, hr(s), hour(s); d, day(s); w, week(s).
// Fractions are exact up to 9 digits and rounded to the nearest millisecond.
// Negative or overflowing values, empty text and unknown units give nullopt
// and a message in *why (if not null).
std::optional<int64_t> parse_duration_ms(std::string_view text, std::string* why);

// Largest of d, h, min, s, ms that divides exactly: "250ms", "2s", "10min",
// "1h", "1d", "1500ms", "0s". parse_duration_ms(format_duration_ms(x)) == x
// for every x >= 0. Negative values get a leading '-'.
std::string format_duration_ms(int64_t ms);

}  // namespace relaybus::core
