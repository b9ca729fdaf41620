#pragma once

// Standard Webhooks signing (https://www.standardwebhooks.com/): the
// webhook-signature header of a delivery.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace relaybus::core {

// The HMAC key of a "whsec_<base64>" secret: the base64-decoded bytes after
// the prefix. False (and *key untouched) if the prefix is missing, the base64
// is invalid or the key is empty.
bool webhook_secret_key(std::string_view whsec_secret, std::string* key);

// "v1,<base64(HMAC-SHA256(key, "{msg_id}.{timestamp_s}.{body}"))>", one per
// secret in the given order, separated by single spaces (several secrets
// during rotation; a receiver accepts the request if any one verifies).
// A secret that webhook_secret_key rejects is skipped (handler options are
// validated when stored, so this does not happen in practice); with no
// usable secret the result is empty. Never throws except std::bad_alloc.
// msg_id should not contain '.' (the scheme joins the parts with dots, so a
// dotted id could be confused with another id/timestamp split).
std::string webhook_signature(const std::vector<std::string>& whsec_secrets, std::string_view msg_id,
                              int64_t timestamp_s, std::string_view body);

}  // namespace relaybus::core
