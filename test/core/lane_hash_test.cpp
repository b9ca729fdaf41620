#include "core/lane_hash.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace relaybus::core {
namespace {

static_assert(kLanes == 64, "kLanes is part of the on-disk format");

std::string vectors_dir() {
  const char* env = std::getenv("RELAYBUS_VECTORS_DIR");
  return env && *env ? env : "test/vectors";
}

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    size_t tab = line.find('\t', start);
    out.push_back(line.substr(start, tab == std::string::npos ? std::string::npos : tab - start));
    if (tab == std::string::npos) return out;
    start = tab + 1;
  }
}

TEST(Fnv1a64, PublishedVectors) {
  EXPECT_EQ(fnv1a64(""), 0xcbf29ce484222325ULL);
  EXPECT_EQ(fnv1a64("a"), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(fnv1a64("foobar"), 0x85944171f73967e8ULL);
}

TEST(Fnv1a64, HighBytesAreNotSignExtended) {
  // Computed by hand from the definition: (offset ^ 0xff) * prime mod 2^64.
  const uint64_t expected = (14695981039346656037ULL ^ 0xffULL) * 1099511628211ULL;
  EXPECT_EQ(fnv1a64(std::string_view("\xff", 1)), expected);
}

TEST(Fnv1a64, EmbeddedNulIsHashed) { EXPECT_NE(fnv1a64(std::string_view("a\0b", 3)), fnv1a64("ab")); }

TEST(LaneHash, VectorsFromIndependentImplementation) {
  const std::string path = vectors_dir() + "/lane_hash.tsv";
  std::ifstream in(path, std::ios::binary);
  ASSERT_TRUE(in.good()) << "cannot open " << path << " (set RELAYBUS_VECTORS_DIR)";
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  ASSERT_EQ(line, "key\tfnv1a64_hex\tlane64");
  int rows = 0;
  bool saw_empty = false, saw_non_ascii = false, saw_long = false;
  while (std::getline(in, line)) {
    if (line.empty()) continue;  // trailing newline only; the empty key row has tabs
    const auto f = split_tabs(line);
    ASSERT_EQ(f.size(), 3u) << "bad row: " << line;
    const std::string& key = f[0];
    const uint64_t hash = std::strtoull(f[1].c_str(), nullptr, 16);
    const int lane = std::atoi(f[2].c_str());
    ASSERT_EQ(f[1].size(), 16u) << line;
    EXPECT_EQ(fnv1a64(key), hash) << "key \"" << key << "\"";
    EXPECT_EQ(lane_for_key(key), lane) << "key \"" << key << "\"";
    EXPECT_EQ(lane_for_key(key, 64), lane);
    saw_empty |= key.empty();
    for (unsigned char c : key) saw_non_ascii |= c >= 0x80;
    saw_long |= key.size() >= 300;
    ++rows;
  }
  EXPECT_GE(rows, 20);
  EXPECT_TRUE(saw_empty);
  EXPECT_TRUE(saw_non_ascii);
  EXPECT_TRUE(saw_long);
}

TEST(LaneHash, LaneForKeyHonoursLaneCount) {
  EXPECT_EQ(lane_for_key(""), 37);  // 0xcbf29ce484222325 % 64
  EXPECT_EQ(lane_for_key("", 1), 0);
  EXPECT_EQ(lane_for_key("a", 7), static_cast<int>(0xaf63dc4c8601ec8cULL % 7));
  EXPECT_EQ(lane_for_key("a", 1000), static_cast<int>(0xaf63dc4c8601ec8cULL % 1000));
}

TEST(LaneHash, NonPositiveLaneCountYieldsZero) {
  EXPECT_EQ(lane_for_key("a", 0), 0);
  EXPECT_EQ(lane_for_key("a", -5), 0);
  EXPECT_EQ(lane_for_unkeyed(42, 0), 0);
  EXPECT_EQ(lane_for_unkeyed(42, -1), 0);
}

TEST(LaneHash, UnkeyedIsIdModuloLanes) {
  EXPECT_EQ(lane_for_unkeyed(0), 0);
  EXPECT_EQ(lane_for_unkeyed(1), 1);
  EXPECT_EQ(lane_for_unkeyed(63), 63);
  EXPECT_EQ(lane_for_unkeyed(64), 0);
  EXPECT_EQ(lane_for_unkeyed(130), 2);
  EXPECT_EQ(lane_for_unkeyed(12345, 10), 5);
  // Negative ids go through uint64_t: 2^64 - 1 = 18446744073709551615.
  EXPECT_EQ(lane_for_unkeyed(-1), 63);
  EXPECT_EQ(lane_for_unkeyed(-1, 10), 5);
  EXPECT_EQ(lane_for_unkeyed(INT64_MIN), 0);
  EXPECT_EQ(lane_for_unkeyed(INT64_MAX), 63);
}

TEST(LaneHash, AllLanesAreReachable) {
  std::vector<int> hits(kLanes, 0);
  for (int i = 0; i < 10000; ++i) ++hits[lane_for_key("key-" + std::to_string(i))];
  for (int lane = 0; lane < kLanes; ++lane) {
    // 10000/64 ~ 156 per lane; a sane hash stays well within 2x.
    EXPECT_GT(hits[lane], 60) << "lane " << lane;
    EXPECT_LT(hits[lane], 300) << "lane " << lane;
  }
}

}  // namespace
}  // namespace relaybus::core
