#include "core/base64.hpp"

#include <gtest/gtest.h>

#include <string>

namespace relaybus::core {
namespace {

std::string dec(std::string_view in) {
  std::string out = "<unchanged>";
  EXPECT_TRUE(base64_decode(in, &out)) << '"' << in << '"';
  return out;
}

void expect_rejected(std::string_view in) {
  std::string out = "<unchanged>";
  EXPECT_FALSE(base64_decode(in, &out)) << '"' << in << '"';
  EXPECT_EQ(out, "<unchanged>") << "output must not be touched on failure";
}

TEST(Base64, Rfc4648Vectors) {
  const std::pair<const char*, const char*> v[] = {
      {"", ""},
      {"f", "Zg=="},
      {"fo", "Zm8="},
      {"foo", "Zm9v"},
      {"foob", "Zm9vYg=="},
      {"fooba", "Zm9vYmE="},
      {"foobar", "Zm9vYmFy"},
  };
  for (const auto& [plain, encoded] : v) {
    EXPECT_EQ(base64_encode(plain), encoded);
    EXPECT_EQ(dec(encoded), plain);
  }
}

TEST(Base64, UsesStandardAlphabet) {
  EXPECT_EQ(base64_encode("\xfb\xff\xbf"), "+/+/");
  EXPECT_EQ(dec("+/+/"), "\xfb\xff\xbf");
}

TEST(Base64, PaddingIsOptional) {
  EXPECT_EQ(dec("Zg"), "f");
  EXPECT_EQ(dec("Zm8"), "fo");
}

TEST(Base64, RoundTripsEveryByteValueAndLength) {
  std::string all;
  for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
  for (size_t n = 0; n <= all.size(); n += 7) {
    const std::string in = all.substr(0, n);
    const std::string enc = base64_encode(in);
    EXPECT_EQ(enc.size() % 4, 0u);
    EXPECT_EQ(dec(enc), in) << n;
  }
  // A known 32-byte whsec_ key from the Standard Webhooks examples decodes to 24 bytes.
  EXPECT_EQ(dec("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").size(), 24u);
}

TEST(Base64, RejectsMalformedInput) {
  expect_rejected("Z");      // 4k+1 characters
  expect_rejected("Zm9vY");  // 4k+1 characters
  expect_rejected("Zg=");    // incomplete padding
  expect_rejected("Zg===");  // too much padding
  expect_rejected("Z===");   // too much padding
  expect_rejected("====");
  expect_rejected("Zg==Zg==");   // padding in the middle
  expect_rejected("Zm9v YmFy");  // whitespace
  expect_rejected("Zm9v\nYmFy");
  expect_rejected("Zm9v-_");  // URL-safe alphabet
  expect_rejected("Zm9v*mFy");
  expect_rejected("Zh==");  // non-zero bits after the last byte
  expect_rejected("Zm9=");
}

TEST(Base64, NullOutputIsAllowed) {
  EXPECT_TRUE(base64_decode("Zm9v", nullptr));
  EXPECT_FALSE(base64_decode("Z", nullptr));
}

}  // namespace
}  // namespace relaybus::core
