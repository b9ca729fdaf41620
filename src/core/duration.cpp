#include "duration.hpp"

#include <limits>

#include "text_util.hpp"

namespace relaybus::core {

namespace {

using text::quote;
using text::set_why;

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kNanoUnit = 1000000000;  // fractions are kept in 1e-9 ms
constexpr int kFracDigits = 9;

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

struct UnitName {
  const char* name;
  int64_t ms;
};

constexpr UnitName kUnits[] = {
    {"ms", 1},
    {"msec", 1},
    {"msecs", 1},
    {"millisecond", 1},
    {"milliseconds", 1},
    {"s", kMsPerSecond},
    {"sec", kMsPerSecond},
    {"secs", kMsPerSecond},
    {"second", kMsPerSecond},
    {"seconds", kMsPerSecond},
    {"m", kMsPerMinute},
    {"min", kMsPerMinute},
    {"mins", kMsPerMinute},
    {"minute", kMsPerMinute},
    {"minutes", kMsPerMinute},
    {"h", kMsPerHour},
    {"hr", kMsPerHour},
    {"hrs", kMsPerHour},
    {"hour", kMsPerHour},
    {"hours", kMsPerHour},
    {"d", kMsPerDay},
    {"day", kMsPerDay},
    {"days", kMsPerDay},
    {"w", 7 * kMsPerDay},
    {"week", 7 * kMsPerDay},
    {"weeks", 7 * kMsPerDay},
};

int64_t unit_ms(std::string_view name) {
  for (const auto& u : kUnits)
    if (text::iequals(name, u.name)) return u.ms;
  return 0;
}

// Exact sum of whole milliseconds plus a fraction in 1e-9 ms, so "0.1s" +
// "0.2s" stays exact and rounding happens once at the end.
class Total {
 public:
  bool add(int64_t whole, int64_t nano) {
    if (whole > kMax - ms_) return false;
    ms_ += whole;
    nano_ += nano;
    if (nano_ >= kNanoUnit) {
      if (ms_ == kMax) return false;
      ms_ += nano_ / kNanoUnit;
      nano_ %= kNanoUnit;
    }
    return true;
  }
  bool rounded(int64_t* out) const {
    if (nano_ * 2 >= kNanoUnit) {
      if (ms_ == kMax) return false;
      *out = ms_ + 1;
    } else {
      *out = ms_;
    }
    return true;
  }

 private:
  int64_t ms_ = 0;
  int64_t nano_ = 0;  // always < kNanoUnit between calls
};

// Reads digits at s[*pos]; false on overflow. Caller checks a digit is there.
bool read_int(std::string_view s, size_t* pos, int64_t* out, size_t* ndigits) {
  int64_t v = 0;
  size_t start = *pos;
  while (*pos < s.size() && is_digit(s[*pos])) {
    int d = s[*pos] - '0';
    if (v > (kMax - d) / 10) return false;
    v = v * 10 + d;
    ++*pos;
  }
  *out = v;
  if (ndigits) *ndigits = *pos - start;
  return true;
}

// Reads ".ddd" if present: the fraction scaled to kFracDigits digits (extra
// digits are ignored). False if '.' is not followed by a digit.
bool read_fraction(std::string_view s, size_t* pos, int64_t* frac9) {
  *frac9 = 0;
  if (*pos >= s.size() || s[*pos] != '.') return true;
  ++*pos;
  if (*pos >= s.size() || !is_digit(s[*pos])) return false;
  int n = 0;
  while (*pos < s.size() && is_digit(s[*pos])) {
    if (n < kFracDigits) {
      *frac9 = *frac9 * 10 + (s[*pos] - '0');
      ++n;
    }
    ++*pos;
  }
  for (; n < kFracDigits; ++n) *frac9 *= 10;
  return true;
}

// value = whole + frac9 / 1e9 units of `unit` ms; added exactly.
bool add_scaled(Total* t, int64_t whole, int64_t frac9, int64_t unit) {
  if (whole > kMax / unit) return false;
  // frac9 < 1e9 and unit <= 7d in ms (6.05e8), so the product fits in int64.
  const int64_t prod = frac9 * unit;
  return t->add(whole * unit, 0) && t->add(prod / kNanoUnit, prod % kNanoUnit);
}

}  // namespace

std::optional<int64_t> parse_duration_ms(std::string_view input, std::string* why) {
  const std::string_view s = text::trim(input);
  if (s.empty()) {
    set_why(why, "duration is empty");
    return std::nullopt;
  }
  // Any '-' is a sign somewhere (PostgreSQL writes "-00:00:05" or
  // "1 day -02:00:00"); none of them is meaningful for a delay.
  if (s.find('-') != std::string_view::npos) {
    set_why(why, "negative durations are not allowed (got " + quote(s) + ")");
    return std::nullopt;
  }

  Total total;
  const auto too_large = [&]() {
    set_why(why, "duration is too large (got " + quote(s) + ")");
    return std::nullopt;
  };
  size_t pos = 0;
  int terms = 0;
  while (pos < s.size()) {
    while (pos < s.size() && text::is_ascii_space(s[pos])) ++pos;
    if (pos >= s.size()) break;
    ++terms;
    if (!is_digit(s[pos])) {
      set_why(why, "expected a number at " + quote(s.substr(pos)));
      return std::nullopt;
    }
    const size_t num_start = pos;
    int64_t whole = 0;
    if (!read_int(s, &pos, &whole, nullptr)) return too_large();

    if (pos < s.size() && s[pos] == ':') {
      // h:m[:s[.frac]] as PostgreSQL prints intervals; 'whole' is hours.
      int64_t minutes = 0, seconds = 0, frac9 = 0;
      size_t nd = 0;
      ++pos;
      if (pos >= s.size() || !is_digit(s[pos]) || !read_int(s, &pos, &minutes, &nd) || nd > 2) {
        set_why(why, "expected h:mm:ss at " + quote(s.substr(num_start)));
        return std::nullopt;
      }
      if (pos < s.size() && s[pos] == ':') {
        ++pos;
        if (pos >= s.size() || !is_digit(s[pos]) || !read_int(s, &pos, &seconds, &nd) || nd > 2 ||
            !read_fraction(s, &pos, &frac9)) {
          set_why(why, "expected h:mm:ss at " + quote(s.substr(num_start)));
          return std::nullopt;
        }
      }
      if (minutes >= 60) {
        set_why(why, "minutes must be below 60 (got " + quote(s) + ")");
        return std::nullopt;
      }
      if (seconds >= 60) {
        set_why(why, "seconds must be below 60 (got " + quote(s) + ")");
        return std::nullopt;
      }
      if (!add_scaled(&total, whole, 0, kMsPerHour) || !add_scaled(&total, minutes, 0, kMsPerMinute) ||
          !add_scaled(&total, seconds, frac9, kMsPerSecond))
        return too_large();
      continue;
    }

    int64_t frac9 = 0;
    if (!read_fraction(s, &pos, &frac9)) {
      set_why(why, "expected a digit after '.' in " + quote(s.substr(num_start)));
      return std::nullopt;
    }
    const std::string_view number = s.substr(num_start, pos - num_start);
    while (pos < s.size() && text::is_ascii_space(s[pos])) ++pos;
    const size_t unit_start = pos;
    while (pos < s.size() && is_alpha(s[pos])) ++pos;
    const std::string_view unit = s.substr(unit_start, pos - unit_start);

    int64_t ms_per_unit = 0;
    if (unit.empty()) {
      // A bare number means seconds, but only when it is the whole text:
      // "1h 30" is more likely a typo than 1h30s.
      if (terms == 1 && pos >= s.size()) {
        ms_per_unit = kMsPerSecond;
      } else if (pos >= s.size()) {
        set_why(why, "missing unit after " + quote(number));
        return std::nullopt;
      } else {
        set_why(why, "expected a unit at " + quote(s.substr(pos)));
        return std::nullopt;
      }
    } else {
      ms_per_unit = unit_ms(unit);
      if (ms_per_unit == 0) {
        set_why(why, "unknown unit " + quote(unit) + " (use ms, s, min, h or d)");
        return std::nullopt;
      }
    }
    if (!add_scaled(&total, whole, frac9, ms_per_unit)) return too_large();
  }

  int64_t result = 0;
  if (!total.rounded(&result)) return too_large();
  return result;
}

std::string format_duration_ms(int64_t ms) {
  if (ms == 0) return "0s";
  // Through uint64 so that INT64_MIN is negated without overflow.
  const bool neg = ms < 0;
  const uint64_t v = neg ? 0 - static_cast<uint64_t>(ms) : static_cast<uint64_t>(ms);
  struct Unit {
    uint64_t ms;
    const char* suffix;
  };
  static constexpr Unit kOrder[] = {{static_cast<uint64_t>(kMsPerDay), "d"},
                                    {static_cast<uint64_t>(kMsPerHour), "h"},
                                    {static_cast<uint64_t>(kMsPerMinute), "min"},
                                    {static_cast<uint64_t>(kMsPerSecond), "s"},
                                    {1, "ms"}};
  for (const auto& u : kOrder) {
    if (v % u.ms == 0) return (neg ? "-" : "") + std::to_string(v / u.ms) + u.suffix;
  }
  return "";  // unreachable: 1 divides everything
}

}  // namespace relaybus::core
