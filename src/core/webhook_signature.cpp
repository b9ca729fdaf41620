#include "webhook_signature.hpp"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "base64.hpp"

namespace relaybus::core {

namespace {

constexpr std::string_view kPrefix = "whsec_";

}  // namespace

bool webhook_secret_key(std::string_view whsec_secret, std::string* key) {
  if (whsec_secret.substr(0, kPrefix.size()) != kPrefix) return false;
  std::string decoded;
  if (!base64_decode(whsec_secret.substr(kPrefix.size()), &decoded) || decoded.empty())
    return false;
  *key = std::move(decoded);
  return true;
}

std::string webhook_signature(const std::vector<std::string>& whsec_secrets,
                              std::string_view msg_id, int64_t timestamp_s,
                              std::string_view body) {
  std::string content;
  content.reserve(msg_id.size() + body.size() + 24);
  content.append(msg_id);
  content += '.';
  content += std::to_string(timestamp_s);
  content += '.';
  content.append(body);

  std::string out;
  for (const std::string& secret : whsec_secrets) {
    std::string key;
    if (!webhook_secret_key(secret, &key)) continue;
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int mac_len = 0;
    if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
             reinterpret_cast<const unsigned char*>(content.data()), content.size(), mac,
             &mac_len) == nullptr)
      continue;
    if (!out.empty()) out += ' ';
    out += "v1,";
    out += base64_encode(std::string_view(reinterpret_cast<const char*>(mac), mac_len));
  }
  return out;
}

}  // namespace relaybus::core
