#include "core/backoff.hpp"

#include <gtest/gtest.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

namespace relaybus::core {
namespace {

TEST(BackoffCeiling, DoublesFromBaseUpToMax) {
  const BackoffPolicy p;  // 1s .. 10min
  EXPECT_EQ(backoff_ceiling_ms(p, 1), 1000);
  EXPECT_EQ(backoff_ceiling_ms(p, 2), 2000);
  EXPECT_EQ(backoff_ceiling_ms(p, 3), 4000);
  EXPECT_EQ(backoff_ceiling_ms(p, 10), 512000);
  EXPECT_EQ(backoff_ceiling_ms(p, 11), 600000);  // 1024s capped at 600s
  EXPECT_EQ(backoff_ceiling_ms(p, 12), 600000);
}

TEST(BackoffCeiling, AttemptBelowOneCountsAsOne) {
  const BackoffPolicy p{250, 10000};
  EXPECT_EQ(backoff_ceiling_ms(p, 0), 250);
  EXPECT_EQ(backoff_ceiling_ms(p, -7), 250);
  EXPECT_EQ(backoff_ceiling_ms(p, INT_MIN), 250);
}

TEST(BackoffCeiling, NoOverflowForHugeAttempts) {
  const BackoffPolicy p{1000, 7LL * 86400000};
  for (int attempt : {40, 53, 54, 62, 63, 64, 65, 100, 1000, INT_MAX})
    EXPECT_EQ(backoff_ceiling_ms(p, attempt), 7LL * 86400000) << attempt;
}

TEST(BackoffCeiling, NoOverflowAtTheEdgeOfInt64) {
  // base 1 shifted by 62 is 2^62, the largest shift that fits.
  EXPECT_EQ(backoff_ceiling_ms({1, INT64_MAX}, 63), int64_t{1} << 62);
  EXPECT_EQ(backoff_ceiling_ms({1, INT64_MAX}, 64), INT64_MAX);
  EXPECT_EQ(backoff_ceiling_ms({3, INT64_MAX}, 62), int64_t{3} << 61);
  EXPECT_EQ(backoff_ceiling_ms({3, INT64_MAX}, 63), INT64_MAX);
  EXPECT_EQ(backoff_ceiling_ms({INT64_MAX, INT64_MAX}, 2), INT64_MAX);
}

TEST(BackoffCeiling, MaxBelowBaseWins) { EXPECT_EQ(backoff_ceiling_ms({5000, 2000}, 1), 2000); }

TEST(BackoffCeiling, NonPositivePolicyGivesZero) {
  EXPECT_EQ(backoff_ceiling_ms({0, 1000}, 3), 0);
  EXPECT_EQ(backoff_ceiling_ms({-5, 1000}, 3), 0);
  EXPECT_EQ(backoff_ceiling_ms({1000, -1}, 3), 0);
}

// test/vectors/backoff.tsv: the table the managed SQL edition's port
// (relay._backoff_ceiling_ms, test/integration/managed_sql.sh) is held to.
TEST(BackoffCeiling, SharedVectors) {
  const char* env = std::getenv("RELAYBUS_VECTORS_DIR");
  const std::string path = std::string(env && *env ? env : "test/vectors") + "/backoff.tsv";
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << "cannot open " << path << " (set RELAYBUS_VECTORS_DIR)";
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  ASSERT_EQ(line, "base_ms\tmax_ms\tattempt\tceiling_ms");
  int rows = 0;
  while (std::getline(in, line)) {
    long long base = 0, max = 0, ceiling = 0;
    int attempt = 0;
    ASSERT_EQ(std::sscanf(line.c_str(), "%lld\t%lld\t%d\t%lld", &base, &max, &attempt, &ceiling), 4) << line;
    EXPECT_EQ(backoff_ceiling_ms({base, max}, attempt), ceiling) << line;
    ++rows;
  }
  EXPECT_GE(rows, 20);
}

TEST(BackoffDelay, FullJitterIsRandomModuloCeilingPlusOne) {
  const BackoffPolicy p;  // attempt 3: ceiling 4000
  EXPECT_EQ(backoff_delay_ms(p, 3, 0), 0);
  EXPECT_EQ(backoff_delay_ms(p, 3, 4000), 4000);  // the ceiling itself is reachable
  EXPECT_EQ(backoff_delay_ms(p, 3, 4001), 0);
  EXPECT_EQ(backoff_delay_ms(p, 3, 12345), 12345 % 4001);
  EXPECT_EQ(backoff_delay_ms(p, 3, UINT64_MAX), static_cast<int64_t>(UINT64_MAX % 4001));
}

TEST(BackoffDelay, StaysWithinCeilingForAnyRandom) {
  const BackoffPolicy p{100, 5000};
  uint64_t x = 0x9E3779B97F4A7C15ULL;
  for (int i = 0; i < 2000; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const int attempt = 1 + i % 20;
    const int64_t d = backoff_delay_ms(p, attempt, x);
    EXPECT_GE(d, 0);
    EXPECT_LE(d, backoff_ceiling_ms(p, attempt));
  }
}

TEST(BackoffDelay, HugeCeilingDoesNotWrap) {
  const BackoffPolicy p{INT64_MAX, INT64_MAX};
  EXPECT_EQ(backoff_delay_ms(p, 1, UINT64_MAX), static_cast<int64_t>(UINT64_MAX % (uint64_t{1} << 63)));
  EXPECT_EQ(backoff_delay_ms({0, 0}, 5, 777), 0);
}

constexpr int64_t kOct21_2015_0728 = 1445412480000;  // Wed, 21 Oct 2015 07:28:00 GMT

TEST(RetryAfter, DeltaSeconds) {
  EXPECT_EQ(retry_after_ms("120", 0), 120000);
  EXPECT_EQ(retry_after_ms("0", 5), 0);
  EXPECT_EQ(retry_after_ms("  7\t", 0), 7000);
  EXPECT_EQ(retry_after_ms("007", 0), 7000);
  EXPECT_EQ(retry_after_ms("9223372036854775", 0), 9223372036854775000);
  EXPECT_EQ(retry_after_ms("9223372036854776", 0), INT64_MAX);  // saturates
  EXPECT_EQ(retry_after_ms("99999999999999999999999999", 0), INT64_MAX);
}

TEST(RetryAfter, ImfFixdate) {
  const char* d = "Wed, 21 Oct 2015 07:28:00 GMT";
  EXPECT_EQ(retry_after_ms(d, kOct21_2015_0728 - 90000), 90000);
  EXPECT_EQ(retry_after_ms(d, kOct21_2015_0728 - 1), 1);
  EXPECT_EQ(retry_after_ms(d, kOct21_2015_0728), 0);
  EXPECT_EQ(retry_after_ms(d, kOct21_2015_0728 + 1), 0);  // in the past
  EXPECT_EQ(retry_after_ms("Sun, 06 Nov 1994 08:49:37 GMT", 784111777000 - 3000), 3000);
  EXPECT_EQ(retry_after_ms("Thu, 29 Feb 2024 00:00:00 GMT", 1709164800000 - 1000), 1000);
  EXPECT_EQ(retry_after_ms("Fri, 31 Dec 9999 23:59:59 GMT", 0), 253402300799000);
  EXPECT_EQ(retry_after_ms(" wed, 21 oct 2015 07:28:00 GMT ", kOct21_2015_0728 - 5000), 5000);
  EXPECT_EQ(retry_after_ms("Sat, 31 Dec 2016 23:59:60 GMT", 1483228799000), 1000);  // leap second
}

TEST(RetryAfter, ObsoleteDateForms) {
  // RFC 850, two-digit year read as the closest year not more than 50 years ahead.
  EXPECT_EQ(retry_after_ms("Sunday, 06-Nov-94 08:49:37 GMT", 784111777000 - 37000), 37000);
  EXPECT_EQ(retry_after_ms("Sunday, 06-Nov-94 08:49:37 GMT", kOct21_2015_0728), 0);  // 1994
  EXPECT_EQ(retry_after_ms("Thursday, 06-Nov-94 08:49:37 GMT", 3939871777000 - 60000),
            60000);  // now is 2094: the year is 2094, not 1994
  // asctime, day padded with a space or two digits.
  EXPECT_EQ(retry_after_ms("Sun Nov  6 08:49:37 1994", 784111777000 - 2000), 2000);
  EXPECT_EQ(retry_after_ms("Wed Oct 21 07:28:00 2015", kOct21_2015_0728 - 1000), 1000);
}

TEST(RetryAfter, Unparseable) {
  for (const char* v : {"",
                        "   ",
                        "-5",
                        "+5",
                        "5s",
                        "1.5",
                        "1 2",
                        "soon",
                        "Wed, 21 Oct 2015 07:28:00 UTC",
                        "Wed, 21 Oct 2015 07:28:00",
                        "Wed, 21 Oct 15 07:28:00 GMT",
                        "Xyz, 21 Oct 2015 07:28:00 GMT",
                        "Wed, 21 Foo 2015 07:28:00 GMT",
                        "Wed, 32 Oct 2015 07:28:00 GMT",
                        "Wed, 29 Feb 2023 07:28:00 GMT",
                        "Wed, 21 Oct 2015 24:00:00 GMT",
                        "Wed, 21 Oct 2015 07:60:00 GMT",
                        "Wed, 21 Oct 2015 07:28:61 GMT",
                        "Wed, 00 Oct 2015 07:28:00 GMT",
                        "Wed, 21 Oct 2015 7:28:00 GMT",
                        "Wed,  21 Oct 2015 07:28:00 GMT",
                        "Wed, 21-Oct-2015 07:28:00 GMT",
                        "Sunday, 06-Nov-1994 08:49:37 GMT",
                        "Sundae, 06-Nov-94 08:49:37 GMT",
                        "Sun Nov 6 08:49:37 1994",
                        "2015-10-21T07:28:00Z"}) {
    EXPECT_EQ(retry_after_ms(v, kOct21_2015_0728), -1) << '"' << v << '"';
  }
}

TEST(RetryAfter, ExtremeNowDoesNotOverflow) {
  EXPECT_EQ(retry_after_ms("Wed, 21 Oct 2015 07:28:00 GMT", INT64_MIN), INT64_MAX);
  EXPECT_EQ(retry_after_ms("Wed, 21 Oct 2015 07:28:00 GMT", INT64_MAX), 0);
  // The two-digit year is taken relative to "now", which lands outside 0..9999.
  EXPECT_EQ(retry_after_ms("Sunday, 06-Nov-94 08:49:37 GMT", INT64_MIN), -1);
  EXPECT_EQ(retry_after_ms("Sunday, 06-Nov-94 08:49:37 GMT", INT64_MAX), -1);
}

TEST(RetryAfter, ClampToMaxAndHardCap) {
  EXPECT_EQ(clamp_retry_after_ms(-1, 1000), -1);
  EXPECT_EQ(clamp_retry_after_ms(0, 1000), 0);
  EXPECT_EQ(clamp_retry_after_ms(999, 1000), 999);
  EXPECT_EQ(clamp_retry_after_ms(1000, 1000), 1000);
  EXPECT_EQ(clamp_retry_after_ms(31536000000, 1000), 1000);  // a year
  EXPECT_EQ(clamp_retry_after_ms(INT64_MAX, 1000), 1000);    // saturated parse
  EXPECT_EQ(clamp_retry_after_ms(INT64_MAX, -1), kRetryAfterCapMs);
  EXPECT_EQ(clamp_retry_after_ms(INT64_MAX, INT64_MAX), kRetryAfterCapMs);
  EXPECT_EQ(clamp_retry_after_ms(kRetryAfterCapMs - 1, -1), kRetryAfterCapMs - 1);
  EXPECT_EQ(kRetryAfterCapMs, int64_t{604800000});
  // From the parser: the result never exceeds the cap, never wraps negative.
  for (const char* v : {"31536000", "99999999999999999999999999", "Fri, 31 Dec 9999 23:59:59 GMT"})
    EXPECT_EQ(clamp_retry_after_ms(retry_after_ms(v, kOct21_2015_0728), 60000), 60000) << v;
  EXPECT_EQ(clamp_retry_after_ms(retry_after_ms("-5", 0), 60000), -1);
  EXPECT_EQ(clamp_retry_after_ms(retry_after_ms("garbage", 0), 60000), -1);
}

}  // namespace
}  // namespace relaybus::core
