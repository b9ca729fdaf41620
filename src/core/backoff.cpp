#include "backoff.hpp"

#include <limits>

#include "text_util.hpp"

namespace relaybus::core {

namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Parses exactly n digits at s[pos].
bool fixed_digits(std::string_view s, size_t pos, size_t n, int* out) {
  if (pos + n > s.size()) return false;
  int v = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!is_digit(s[pos + i])) return false;
    v = v * 10 + (s[pos + i] - '0');
  }
  *out = v;
  return true;
}

// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's
// days_from_civil), used instead of timegm() to stay independent of the
// process time zone and locale.
int64_t days_from_civil(int64_t y, int m, int d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

// Inverse of days_from_civil, for the year only (RFC 850 two-digit years).
int64_t year_from_days(int64_t z) {
  z += 719468;
  const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  const int64_t doe = z - era * 146097;
  const int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  const int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const int64_t mp = (5 * doy + 2) / 153;
  const int64_t m = mp < 10 ? mp + 3 : mp - 9;
  return yoe + era * 400 + (m <= 2);
}

bool is_leap(int64_t y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

int days_in_month(int64_t y, int m) {
  static constexpr int kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  return m == 2 && is_leap(y) ? 29 : kDays[m - 1];
}

// 1..12 for "Jan".."Dec" (case-insensitive), else 0.
int month_number(std::string_view s) {
  static constexpr const char* kNames[] = {"jan", "feb", "mar", "apr", "may", "jun",
                                           "jul", "aug", "sep", "oct", "nov", "dec"};
  for (int i = 0; i < 12; ++i)
    if (text::iequals(s, kNames[i])) return i + 1;
  return 0;
}

bool is_day_name(std::string_view s, bool long_form) {
  static constexpr const char* kShort[] = {"mon", "tue", "wed", "thu", "fri", "sat", "sun"};
  static constexpr const char* kLong[] = {"monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"};
  for (int i = 0; i < 7; ++i)
    if (text::iequals(s, long_form ? kLong[i] : kShort[i])) return true;
  return false;
}

struct DateTime {
  int64_t year = 0;
  int month = 0, day = 0, hour = 0, minute = 0, second = 0;
};

// "HH:MM:SS" at s[pos].
bool parse_time(std::string_view s, size_t pos, DateTime* dt) {
  return fixed_digits(s, pos, 2, &dt->hour) && pos + 2 < s.size() && s[pos + 2] == ':' &&
         fixed_digits(s, pos + 3, 2, &dt->minute) && pos + 5 < s.size() && s[pos + 5] == ':' &&
         fixed_digits(s, pos + 6, 2, &dt->second);
}

// Sun, 06 Nov 1994 08:49:37 GMT
bool parse_imf_fixdate(std::string_view s, DateTime* dt) {
  if (s.size() != 29 || s[3] != ',' || s[4] != ' ' || s[7] != ' ' || s[11] != ' ' || s[16] != ' ' || s[25] != ' ' ||
      s.substr(26) != "GMT")
    return false;
  int year = 0;
  if (!is_day_name(s.substr(0, 3), false) || !fixed_digits(s, 5, 2, &dt->day) ||
      (dt->month = month_number(s.substr(8, 3))) == 0 || !fixed_digits(s, 12, 4, &year) || !parse_time(s, 17, dt))
    return false;
  dt->year = year;
  return true;
}

// Sunday, 06-Nov-94 08:49:37 GMT
bool parse_rfc850(std::string_view s, int64_t now_year, DateTime* dt) {
  const size_t comma = s.find(',');
  if (comma == std::string_view::npos || !is_day_name(s.substr(0, comma), true)) return false;
  const std::string_view r = s.substr(comma);
  if (r.size() != 24 || r[1] != ' ' || r[4] != '-' || r[8] != '-' || r[11] != ' ' || r[20] != ' ' ||
      r.substr(21) != "GMT")
    return false;
  int yy = 0;
  if (!fixed_digits(r, 2, 2, &dt->day) || (dt->month = month_number(r.substr(5, 3))) == 0 ||
      !fixed_digits(r, 9, 2, &yy) || !parse_time(r, 12, dt))
    return false;
  // RFC 7231 7.1.1.1: a two-digit year more than 50 years in the future means
  // the most recent past year with those digits.
  int64_t year = now_year - now_year % 100 + yy;
  if (year > now_year + 50) year -= 100;
  dt->year = year;
  return true;
}

// Sun Nov  6 08:49:37 1994
bool parse_asctime(std::string_view s, DateTime* dt) {
  if (s.size() != 24 || s[3] != ' ' || s[7] != ' ' || s[10] != ' ' || s[19] != ' ') return false;
  int year = 0;
  if (!is_day_name(s.substr(0, 3), false) || (dt->month = month_number(s.substr(4, 3))) == 0) return false;
  if (s[8] == ' ') {
    if (!fixed_digits(s, 9, 1, &dt->day)) return false;
  } else if (!fixed_digits(s, 8, 2, &dt->day)) {
    return false;
  }
  if (!parse_time(s, 11, dt) || !fixed_digits(s, 20, 4, &year)) return false;
  dt->year = year;
  return true;
}

bool valid_date_time(const DateTime& dt) {
  // Second 60 is a leap second, allowed by the HTTP-date grammar. Years are
  // 4-digit, which also keeps the ms arithmetic far from overflow (an RFC 850
  // year derived from an absurd "now" falls outside and is refused).
  return dt.year >= 0 && dt.year <= 9999 && dt.month >= 1 && dt.month <= 12 && dt.day >= 1 &&
         dt.day <= days_in_month(dt.year, dt.month) && dt.hour <= 23 && dt.minute <= 59 && dt.second <= 60;
}

}  // namespace

int64_t backoff_ceiling_ms(const BackoffPolicy& p, int attempt) noexcept {
  if (p.base_ms <= 0 || p.max_ms <= 0) return 0;
  const int shift = attempt < 1 ? 0 : attempt - 1;
  // base << shift would exceed INT64_MAX (and so max_ms) once shift >= 63 or
  // base > INT64_MAX >> shift.
  if (shift >= 63 || p.base_ms > (kMax >> shift)) return p.max_ms;
  const int64_t v = p.base_ms << shift;
  return v < p.max_ms ? v : p.max_ms;
}

int64_t backoff_delay_ms(const BackoffPolicy& p, int attempt, uint64_t random64) noexcept {
  const uint64_t ceiling = static_cast<uint64_t>(backoff_ceiling_ms(p, attempt));
  // ceiling <= INT64_MAX, so ceiling + 1 cannot wrap.
  return static_cast<int64_t>(random64 % (ceiling + 1));
}

int64_t clamp_retry_after_ms(int64_t delay_ms, int64_t max_ms) {
  if (delay_ms < 0) return -1;
  const int64_t cap = max_ms >= 0 && max_ms < kRetryAfterCapMs ? max_ms : kRetryAfterCapMs;
  return delay_ms < cap ? delay_ms : cap;
}

int64_t retry_after_ms(std::string_view header_value, int64_t now_epoch_ms) {
  // Header values may carry optional whitespace around them (RFC 7230 OWS).
  std::string_view s = header_value;
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  if (s.empty()) return -1;

  if (is_digit(s.front())) {
    int64_t ms = 0;
    for (char c : s) {
      if (!is_digit(c)) return -1;
      // Saturate: a server asking for "forever" gets the largest delay; the
      // caller clamps it to its own maximum anyway.
      if (ms > (kMax - (c - '0') * 1000) / 10) {
        ms = kMax;
        continue;
      }
      ms = ms * 10 + (c - '0') * 1000;
    }
    return ms;
  }

  // Floor division, written so that no value of now_epoch_ms can overflow.
  int64_t now_days = now_epoch_ms / 86400000;
  if (now_epoch_ms % 86400000 < 0) --now_days;
  DateTime dt;
  if (!parse_imf_fixdate(s, &dt) && !parse_rfc850(s, year_from_days(now_days), &dt) && !parse_asctime(s, &dt))
    return -1;
  if (!valid_date_time(dt)) return -1;
  const int64_t at_ms = ((days_from_civil(dt.year, dt.month, dt.day) * 24 + dt.hour) * 60 + dt.minute) * 60000 +
                        int64_t{dt.second} * 1000;
  if (at_ms <= now_epoch_ms) return 0;
  // at_ms is within years 0..9999, so only an absurdly negative "now" overflows.
  if (now_epoch_ms < 0 && at_ms > kMax + now_epoch_ms) return kMax;
  return at_ms - now_epoch_ms;
}

}  // namespace relaybus::core
