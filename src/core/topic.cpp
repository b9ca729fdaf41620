#include "topic.hpp"

#include <vector>

#include "text_util.hpp"

namespace relaybus::core {

namespace {

using text::describe_char;
using text::set_why;

bool is_segment_char(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

bool validate(std::string_view s, bool allow_wildcards, std::string* why) {
  if (s.empty()) {
    set_why(why, "must not be empty");
    return false;
  }
  if (s.size() > kMaxTopicBytes) {
    set_why(why, "longer than 255 bytes");
    return false;
  }
  size_t seg_no = 1;
  size_t seg_start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i < s.size() && s[i] != '.') continue;
    std::string_view seg = s.substr(seg_start, i - seg_start);
    if (seg.empty()) {
      set_why(why, "segment " + std::to_string(seg_no) + " is empty");
      return false;
    }
    if (!(allow_wildcards && (seg == "*" || seg == "#"))) {
      for (char ch : seg) {
        auto c = static_cast<unsigned char>(ch);
        if (is_segment_char(c)) continue;
        if (allow_wildcards && (c == '*' || c == '#')) {
          set_why(why, std::string("wildcard '") + ch + "' must be a whole segment (segment " + std::to_string(seg_no) +
                           ")");
        } else {
          set_why(why, describe_char(c) + " is not allowed");
        }
        return false;
      }
    }
    ++seg_no;
    seg_start = i + 1;
  }
  return true;
}

std::vector<std::string_view> split_segments(std::string_view s) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (;;) {
    size_t dot = s.find('.', start);
    if (dot == std::string_view::npos) {
      out.push_back(s.substr(start));
      return out;
    }
    out.push_back(s.substr(start, dot - start));
    start = dot + 1;
  }
}

}  // namespace

bool is_valid_topic(std::string_view topic, std::string* why) { return validate(topic, false, why); }

bool is_valid_pattern(std::string_view pattern, std::string* why) { return validate(pattern, true, why); }

bool topic_matches(std::string_view pattern, std::string_view topic) {
  if (pattern.find_first_of("*#") == std::string_view::npos) return pattern == topic;

  const auto pat = split_segments(pattern);
  const auto top = split_segments(topic);
  // Dynamic programming over (pattern prefix, topic prefix) instead of
  // backtracking, so "#.#.#..." patterns cannot blow up: O(|pat| * |top|).
  // row[j]: pat[0..i) matches top[0..j).
  std::vector<char> row(top.size() + 1, 0), next(top.size() + 1, 0);
  row[0] = 1;
  for (size_t i = 0; i < pat.size(); ++i) {
    const std::string_view p = pat[i];
    if (p == "#") {
      // Zero segments (row[j]) or one more segment (next[j-1]).
      next[0] = row[0];
      for (size_t j = 1; j <= top.size(); ++j) next[j] = row[j] || next[j - 1];
    } else {
      next[0] = 0;
      for (size_t j = 1; j <= top.size(); ++j) next[j] = row[j - 1] && (p == "*" || p == top[j - 1]);
    }
    row.swap(next);
  }
  return row[top.size()] != 0;
}

int pattern_specificity(std::string_view pattern) {
  int stars = 0, hashes = 0;
  for (std::string_view seg : split_segments(pattern)) {
    if (seg == "*")
      ++stars;
    else if (seg == "#")
      ++hashes;
  }
  if (stars == 0 && hashes == 0) return 0;
  return 1 + stars + 100 * hashes;
}

}  // namespace relaybus::core
