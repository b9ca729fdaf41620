#pragma once

// Small text helpers shared by the validators, so error messages quote user
// input the same way everywhere. Internal to src/core.

#include <string>
#include <string_view>

namespace relaybus::core::text {

// Stores msg in *why when why is not null (the public API allows nullptr).
void set_why(std::string* why, std::string msg);

// "character '!'" for printable ASCII, "a space", else "byte 0x0A": keeps
// messages readable and valid UTF-8 whatever the input bytes were.
std::string describe_char(unsigned char c);

// Double-quoted excerpt of user input for error messages: at most max_bytes
// (cut on a UTF-8 boundary, "..." appended), control bytes replaced by '?',
// '"' and '\' escaped.
std::string quote(std::string_view s, size_t max_bytes = 40);

// At most max_bytes of s, cut on a UTF-8 boundary, with "..." appended when cut.
std::string truncate_utf8(std::string_view s, size_t max_bytes);

bool is_ascii_space(char c);
std::string_view trim(std::string_view s);
std::string ascii_lower(std::string_view s);
bool iequals(std::string_view a, std::string_view b);

}  // namespace relaybus::core::text
