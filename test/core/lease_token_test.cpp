#include "core/lease_token.hpp"

#include <gtest/gtest.h>

using namespace relaybus::core;

TEST(LeaseToken, RoundTrip) {
  uint64_t hi = 0, lo = 0;
  ASSERT_TRUE(parse_lease_token("59fb19a2-86f1-47a6-8ec5-d43fc51c0c1d", &hi, &lo));
  EXPECT_EQ(hi, 0x59fb19a286f147a6ULL);
  EXPECT_EQ(lo, 0x8ec5d43fc51c0c1dULL);
  EXPECT_EQ(format_lease_token(hi, lo), "59fb19a2-86f1-47a6-8ec5-d43fc51c0c1d");
  EXPECT_EQ(format_lease_token(0, 0), "00000000-0000-0000-0000-000000000000");
  EXPECT_EQ(format_lease_token(~0ULL, 1), "ffffffff-ffff-ffff-0000-000000000001");
}

TEST(LeaseToken, UpperCaseIsRead) {
  uint64_t hi = 0, lo = 0;
  ASSERT_TRUE(parse_lease_token("59FB19A2-86F1-47A6-8EC5-D43FC51C0C1D", &hi, &lo));
  EXPECT_EQ(format_lease_token(hi, lo), "59fb19a2-86f1-47a6-8ec5-d43fc51c0c1d");
}

TEST(LeaseToken, RefusesOtherText) {
  uint64_t hi = 7, lo = 9;
  for (const char* bad : {"", "59fb19a2-86f1-47a6-8ec5-d43fc51c0c1", "59fb19a2-86f1-47a6-8ec5-d43fc51c0c1dd",
                          "59fb19a2086f1-47a6-8ec5-d43fc51c0c1d", "59fb19a2-86f1-47a6-8ec5-d43fc51c0c1g",
                          "{59fb19a2-86f1-47a6-8ec5-d43fc51c0c}", "59fb19a286f147a68ec5d43fc51c0c1d"}) {
    EXPECT_FALSE(parse_lease_token(bad, &hi, &lo)) << bad;
  }
  EXPECT_EQ(hi, 7u);
  EXPECT_EQ(lo, 9u);
}

TEST(HttpLease, CoversTheTimeout) {
  EXPECT_EQ(http_lease_ms(30000, 30000, 2000), 34000);  // defaults: the timeout wins
  EXPECT_EQ(http_lease_ms(60000, 5000, 2000), 60000);   // a longer lease stays
  EXPECT_EQ(http_lease_ms(1000, 100, 200), 1000);       // never below a second
  EXPECT_EQ(http_lease_ms(1000, 3600000, 2000), 3604000);
  EXPECT_EQ(http_lease_ms(86400000, 86400000, 2000), 86400000);  // never above a day
}

TEST(HttpLease, QueueTime) {
  EXPECT_EQ(http_queue_ms(http_lease_ms(30000, 30000, 2000), 30000, 2000), 2000);  // a margin to wait in
  EXPECT_EQ(http_queue_ms(60000, 5000, 1000), 54000);
  EXPECT_EQ(http_queue_ms(1000, 5000, 1000), 0);
}
