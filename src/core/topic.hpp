#pragma once

#include <string>
#include <string_view>

namespace relaybus::core {

constexpr size_t kMaxTopicBytes = 255;

// 1..255 bytes of segments [A-Za-z0-9_-]+ separated by single '.'.
// On failure *why (if not null) gets e.g. "segment 2 is empty",
// "character '!' is not allowed", "longer than 255 bytes".
bool is_valid_topic(std::string_view topic, std::string* why);

// Like a topic, but a whole segment may also be "*" (exactly one segment) or
// "#" (zero or more segments).
bool is_valid_pattern(std::string_view pattern, std::string* why);

// Matches a pattern against a topic, segment by segment. Does not validate
// either argument (validate on the way in); on arbitrary text it still
// terminates and treats '.' as the separator.
bool topic_matches(std::string_view pattern, std::string_view topic);

// Orders several routes of one handler matching the same topic; lower is more
// specific: 0 for an exact topic, else 1 + number of '*' segments + 100 *
// number of '#' segments (one '#' outweighs any number of '*').
int pattern_specificity(std::string_view pattern);

}  // namespace relaybus::core
