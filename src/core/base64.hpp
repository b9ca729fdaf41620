#pragma once

#include <string>
#include <string_view>

namespace relaybus::core {

// Standard alphabet (RFC 4648 section 4, '+' and '/'), with '=' padding.
std::string base64_encode(std::string_view bytes);

// Standard alphabet. Padding is optional, but when present it must be
// complete (length a multiple of 4). No whitespace, no URL-safe alphabet.
// Non-zero bits left over in the last character are rejected, so every
// decodable text has exactly one encoding of its bytes. On failure *out is
// left unchanged.
bool base64_decode(std::string_view in, std::string* out);

}  // namespace relaybus::core
