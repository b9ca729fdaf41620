#include "webhook_signature.hpp"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstring>
#include <memory>

#include "base64.hpp"

namespace relaybus::core {

namespace {

constexpr std::string_view kPrefix = "whsec_";
constexpr size_t kBlock = 64;  // SHA-256's block size

struct MdCtxFree {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
using MdCtx = std::unique_ptr<EVP_MD_CTX, MdCtxFree>;

// HMAC-SHA256 with the key's two padded blocks hashed once (RFC 2104): a
// signature then costs copies of these states and the message's hashing.
// OpenSSL 3's one-shot HMAC() fetches the algorithm and makes its contexts
// on every call, which cost more than hashing a webhook body.
struct KeyState {
  std::string secret;  // the "whsec_..." text it was made from
  bool usable = false;
  MdCtx inner, outer;
};

bool init_state(const std::string& secret, KeyState* s) {
  s->secret = secret;
  s->usable = false;
  std::string key;
  if (!webhook_secret_key(secret, &key)) return true;  // skipped, as before
  const EVP_MD* md = EVP_sha256();
  unsigned char k[kBlock] = {};
  unsigned int klen = 0;
  if (key.size() > kBlock) {
    if (EVP_Digest(key.data(), key.size(), k, &klen, md, nullptr) != 1) return false;
  } else {
    std::memcpy(k, key.data(), key.size());
  }
  unsigned char ipad[kBlock], opad[kBlock];
  for (size_t i = 0; i < kBlock; i++) {
    ipad[i] = static_cast<unsigned char>(k[i] ^ 0x36);
    opad[i] = static_cast<unsigned char>(k[i] ^ 0x5c);
  }
  s->inner.reset(EVP_MD_CTX_new());
  s->outer.reset(EVP_MD_CTX_new());
  bool ok = s->inner && s->outer && EVP_DigestInit_ex(s->inner.get(), md, nullptr) == 1 &&
            EVP_DigestUpdate(s->inner.get(), ipad, kBlock) == 1 &&
            EVP_DigestInit_ex(s->outer.get(), md, nullptr) == 1 && EVP_DigestUpdate(s->outer.get(), opad, kBlock) == 1;
  s->usable = ok;
  return ok;
}

// The states of the secrets last signed with, per thread (a handler signs
// every request with the same secrets).
struct SignerCache {
  std::vector<KeyState> keys;
  MdCtx scratch{EVP_MD_CTX_new()};

  bool matches(const std::vector<std::string>& secrets) const {
    if (secrets.size() != keys.size()) return false;
    for (size_t i = 0; i < secrets.size(); i++)
      if (secrets[i] != keys[i].secret) return false;
    return true;
  }
};

thread_local SignerCache cache;

// HMAC(key, "{msg_id}.{timestamp}.{body}") without joining the parts.
bool sign(const KeyState& s, EVP_MD_CTX* c, std::string_view msg_id, std::string_view ts, std::string_view body,
          unsigned char* mac, unsigned int* mac_len) {
  unsigned char inner[EVP_MAX_MD_SIZE];
  unsigned int inner_len = 0;
  return EVP_MD_CTX_copy_ex(c, s.inner.get()) == 1 && EVP_DigestUpdate(c, msg_id.data(), msg_id.size()) == 1 &&
         EVP_DigestUpdate(c, ".", 1) == 1 && EVP_DigestUpdate(c, ts.data(), ts.size()) == 1 &&
         EVP_DigestUpdate(c, ".", 1) == 1 && EVP_DigestUpdate(c, body.data(), body.size()) == 1 &&
         EVP_DigestFinal_ex(c, inner, &inner_len) == 1 && EVP_MD_CTX_copy_ex(c, s.outer.get()) == 1 &&
         EVP_DigestUpdate(c, inner, inner_len) == 1 && EVP_DigestFinal_ex(c, mac, mac_len) == 1;
}

}  // namespace

bool webhook_secret_key(std::string_view whsec_secret, std::string* key) {
  if (whsec_secret.substr(0, kPrefix.size()) != kPrefix) return false;
  std::string decoded;
  if (!base64_decode(whsec_secret.substr(kPrefix.size()), &decoded) || decoded.empty()) return false;
  *key = std::move(decoded);
  return true;
}

std::string webhook_signature(const std::vector<std::string>& whsec_secrets, std::string_view msg_id,
                              int64_t timestamp_s, std::string_view body) {
  if (!cache.matches(whsec_secrets)) {
    cache.keys.clear();
    cache.keys.resize(whsec_secrets.size());
    for (size_t i = 0; i < whsec_secrets.size(); i++)
      if (!init_state(whsec_secrets[i], &cache.keys[i])) {
        cache.keys.clear();  // out of memory in OpenSSL: made again next time
        return {};
      }
  }
  if (!cache.scratch) cache.scratch.reset(EVP_MD_CTX_new());
  if (!cache.scratch) return {};
  const std::string ts = std::to_string(timestamp_s);
  std::string out;
  for (const KeyState& s : cache.keys) {
    if (!s.usable) continue;
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int mac_len = 0;
    if (!sign(s, cache.scratch.get(), msg_id, ts, body, mac, &mac_len)) continue;
    if (!out.empty()) out += ' ';
    out += "v1,";
    out += base64_encode(std::string_view(reinterpret_cast<const char*>(mac), mac_len));
  }
  return out;
}

}  // namespace relaybus::core
