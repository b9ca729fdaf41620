#include "core/webhook_signature.hpp"

#include <gtest/gtest.h>
#include <unistd.h>
#include <sys/wait.h>

#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "core/base64.hpp"

#include <openssl/evp.h>
#include <openssl/hmac.h>

namespace relaybus::core {
namespace {

// The Standard Webhooks reference vector (its spec and every official library's tests).
constexpr const char* kSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
constexpr const char* kMsgId = "msg_p5jXN8AQM9LWM0D4loKWxJek";
constexpr int64_t kTimestamp = 1614265330;
constexpr const char* kBody = R"({"test": 2432232314})";
constexpr const char* kExpected = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

TEST(WebhookSignature, ReferenceVector) {
  EXPECT_EQ(webhook_signature({kSecret}, kMsgId, kTimestamp, kBody), kExpected);
}

TEST(WebhookSignature, EverySecretSignsDuringRotation) {
  const std::string other = "whsec_" + base64_encode("another key, 32 bytes long......");
  const std::string both = webhook_signature({other, kSecret}, kMsgId, kTimestamp, kBody);
  const std::string first = webhook_signature({other}, kMsgId, kTimestamp, kBody);
  EXPECT_EQ(both, first + " " + kExpected);
  EXPECT_NE(first, kExpected);
  EXPECT_EQ(first.rfind("v1,", 0), 0u);
  EXPECT_EQ(first.size(), 3u + 44u);  // base64 of 32 bytes
}

TEST(WebhookSignature, EveryPartIsSigned) {
  const std::string base = webhook_signature({kSecret}, kMsgId, kTimestamp, kBody);
  EXPECT_NE(webhook_signature({kSecret}, "msg_other", kTimestamp, kBody), base);
  EXPECT_NE(webhook_signature({kSecret}, kMsgId, kTimestamp + 1, kBody), base);
  EXPECT_NE(webhook_signature({kSecret}, kMsgId, kTimestamp, R"({"test": 2432232315})"), base);
  // The scheme joins the parts with '.', so a message id with a '.' in it
  // could collide with another id/timestamp split: ids must be dot-free.
  EXPECT_EQ(webhook_signature({kSecret}, "a.1", 2, "x"), webhook_signature({kSecret}, "a", 1, "2.x"));
}

TEST(WebhookSignature, BodyBytesAreSignedAsIs) {
  std::string body("\x00\xff{\"k\":\"\xc3\xa9\"}\n", 13);
  const std::string sig = webhook_signature({kSecret}, kMsgId, kTimestamp, body);
  EXPECT_EQ(sig.size(), 47u);
  EXPECT_NE(sig, webhook_signature({kSecret}, kMsgId, kTimestamp, body.substr(1)));
}

TEST(WebhookSignature, UnusableSecretsAreSkipped) {
  EXPECT_EQ(webhook_signature({}, kMsgId, kTimestamp, kBody), "");
  EXPECT_EQ(webhook_signature({"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}, kMsgId, kTimestamp, kBody), "");
  EXPECT_EQ(webhook_signature({"whsec_not base64!"}, kMsgId, kTimestamp, kBody), "");
  EXPECT_EQ(webhook_signature({"whsec_"}, kMsgId, kTimestamp, kBody), "");
  EXPECT_EQ(webhook_signature({"whsec_!!", kSecret}, kMsgId, kTimestamp, kBody), kExpected);
}

// OpenSSL's one-shot HMAC over the joined content: the definition that the
// signer's kept key states must agree with.
std::string reference_signature(const std::string& key, const std::string& msg_id, int64_t ts,
                                const std::string& body) {
  const std::string content = msg_id + "." + std::to_string(ts) + "." + body;
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(content.data()),
       content.size(), mac, &len);
  return "v1," + base64_encode(std::string_view(reinterpret_cast<const char*>(mac), len));
}

TEST(WebhookSignature, KeysOfEveryLengthMatchHmac) {
  // 1 byte, a block (64) and longer than a block (hashed first, RFC 2104).
  for (size_t n : {1u, 32u, 63u, 64u, 65u, 200u}) {
    std::string key(n, '\0');
    for (size_t i = 0; i < n; i++) key[i] = static_cast<char>(i * 7 + n);
    const std::string secret = "whsec_" + base64_encode(key);
    EXPECT_EQ(webhook_signature({secret}, kMsgId, kTimestamp, kBody),
              reference_signature(key, kMsgId, kTimestamp, kBody))
        << n << "-byte key";
  }
}

TEST(WebhookSignature, ChangedSecretsSignWithTheNewOnes) {
  // Signing keeps the last secrets' key states: a handler's rotated (or
  // another handler's) secrets must never be signed with the old ones.
  const std::string key_a = "first key, 32 bytes long........";
  const std::string key_b = "second key, 32 bytes long.......";
  const std::string a = "whsec_" + base64_encode(key_a);
  const std::string b = "whsec_" + base64_encode(key_b);
  for (int round = 0; round < 3; round++) {
    EXPECT_EQ(webhook_signature({a}, "msg_1", 1, "x"), reference_signature(key_a, "msg_1", 1, "x"));
    EXPECT_EQ(webhook_signature({b}, "msg_1", 1, "x"), reference_signature(key_b, "msg_1", 1, "x"));
    EXPECT_EQ(webhook_signature({a, b}, "msg_2", 2, "y"),
              reference_signature(key_a, "msg_2", 2, "y") + " " + reference_signature(key_b, "msg_2", 2, "y"));
    EXPECT_EQ(webhook_signature({b, a}, "msg_2", 2, "y"),
              reference_signature(key_b, "msg_2", 2, "y") + " " + reference_signature(key_a, "msg_2", 2, "y"));
    EXPECT_EQ(webhook_signature({}, "msg_2", 2, "y"), "");
    EXPECT_EQ(webhook_signature({"whsec_!!", a}, "msg_3", 3, ""), reference_signature(key_a, "msg_3", 3, ""));
  }
}

TEST(WebhookSignature, SecretKey) {
  std::string key = "unchanged";
  EXPECT_FALSE(webhook_secret_key("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", &key));
  EXPECT_FALSE(webhook_secret_key("whsec_", &key));
  EXPECT_FALSE(webhook_secret_key("WHSEC_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", &key));
  EXPECT_EQ(key, "unchanged");
  ASSERT_TRUE(webhook_secret_key(kSecret, &key));
  EXPECT_EQ(key.size(), 24u);
  EXPECT_EQ(base64_encode(key), "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
}

// ---- verified by an independent implementation: standardwebhooks from PyPI ----

std::string script_path() {
  std::string here = __FILE__;
  return here.substr(0, here.rfind('/') + 1) + "verify_signature.py";
}

// Runs verify_signature.py; returns its exit status (77 = the package is missing).
int verify_with_python(const std::string& secret, const std::string& id, int64_t ts, const std::string& body,
                       const std::string& signature, std::string* output) {
  const std::string dir = ::testing::TempDir();
  // Per process: two test runs at once (two checkouts) must not share the file.
  const std::string body_file = dir + "relaybus_sig_body." + std::to_string(getpid()) + ".bin";
  FILE* f = fopen(body_file.c_str(), "wb");
  if (f == nullptr) return -1;
  fwrite(body.data(), 1, body.size(), f);
  fclose(f);
  // Arguments contain only base64, '_' and digits, and ' ' inside the quotes.
  const std::string cmd = "python3 '" + script_path() + "' '" + secret + "' '" + id + "' " + std::to_string(ts) + " '" +
                          body_file + "' '" + signature + "' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[512];
  std::string out;
  while (fgets(buf, sizeof buf, p) != nullptr) out += buf;
  const int st = pclose(p);
  remove(body_file.c_str());
  *output = out;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

TEST(WebhookSignature, VerifiedByTheStandardWebhooksPackage) {
  const int64_t now = static_cast<int64_t>(std::time(nullptr));  // the verifier checks freshness
  const std::string second = "whsec_" + base64_encode("rotation: the new key of 24B");
  const std::string body = R"({"id":7,"topic":"order.created","payload":{"x":"\u00e9"}})";
  const std::string sig = webhook_signature({kSecret, second}, "msg_2xYz", now, body);

  std::string out;
  const int rc = verify_with_python(kSecret, "msg_2xYz", now, body, sig, &out);
  if (rc == 77 || rc == 127)
    FAIL() << "python3 with the standardwebhooks package is not available (scripts/install-deps.sh installs it): "
           << out;
  EXPECT_EQ(rc, 0) << out;
  // Either secret of a rotation verifies.
  EXPECT_EQ(verify_with_python(second, "msg_2xYz", now, body, sig, &out), 0) << out;
  // And it rejects what it must (exit 1): another body, another secret.
  EXPECT_EQ(verify_with_python(kSecret, "msg_2xYz", now, body + " ", sig, &out), 1) << out;
  const std::string stranger = "whsec_" + base64_encode("not one of the signing keys");
  EXPECT_EQ(verify_with_python(stranger, "msg_2xYz", now, body, sig, &out), 1) << out;
}

}  // namespace
}  // namespace relaybus::core
