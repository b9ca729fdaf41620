#include "core/limit_share.hpp"

#include <gtest/gtest.h>

namespace relaybus::core {
namespace {

HandlerOptions limits(int max_concurrency, double rate, int burst) {
  HandlerOptions o;
  o.max_concurrency = max_concurrency;
  o.rate = rate;
  o.burst = burst;
  return o;
}

TEST(SplitLimits, MaxConcurrencyAddsUpAcrossRanks) {
  for (int max : {1, 2, 5, 7, 100}) {
    for (int of : {1, 2, 3, 4}) {
      int sum = 0;
      for (int rank = 0; rank < of; rank++) sum += split_limits(limits(max, 0, 0), of, rank).max_concurrency;
      // Exact when each rank gets one at least; otherwise one each.
      EXPECT_EQ(sum, std::max(max, of)) << max << " of " << of;
    }
  }
  EXPECT_EQ(split_limits(limits(5, 0, 0), 2, 0).max_concurrency, 3);
  EXPECT_EQ(split_limits(limits(5, 0, 0), 2, 1).max_concurrency, 2);
}

TEST(SplitLimits, RateAndBurstSplitEvenly) {
  const HandlerOptions s = split_limits(limits(0, 20, 4), 2, 1);
  EXPECT_DOUBLE_EQ(s.rate, 10);
  EXPECT_EQ(s.burst, 2);
  EXPECT_EQ(s.max_concurrency, 0);  // unset stays unset
  EXPECT_EQ(split_limits(limits(0, 20, 1), 3, 0).burst, 1);
  // burst 0 is the default, ceil(rate).
  EXPECT_EQ(split_limits(limits(0, 20, 0), 2, 0).burst, 10);
  const HandlerOptions none = split_limits(limits(0, 0, 0), 3, 2);
  EXPECT_EQ(none.rate, 0);
  EXPECT_EQ(none.burst, 0);
}

TEST(SplitLimits, OutOfRangeRankAndCount) {
  EXPECT_EQ(split_limits(limits(3, 0, 0), 0, 0).max_concurrency, 3);
  EXPECT_EQ(split_limits(limits(3, 0, 0), 2, 9).max_concurrency, 1);
}

TEST(TokenBucket, StartsFullThenRefillsAtRate) {
  TokenBucket b;
  int64_t retry = 0;
  EXPECT_TRUE(b.take(10, 2, 1000, &retry));
  EXPECT_TRUE(b.take(10, 2, 1000, &retry));
  EXPECT_FALSE(b.take(10, 2, 1000, &retry));
  EXPECT_EQ(retry, 100);
  EXPECT_FALSE(b.take(10, 2, 1050, &retry));
  EXPECT_EQ(retry, 50);
  EXPECT_TRUE(b.take(10, 2, 1100, &retry));
  // A long quiet spell refills to the cap, not beyond.
  EXPECT_TRUE(b.take(10, 2, 60000, &retry));
  EXPECT_TRUE(b.take(10, 2, 60000, &retry));
  EXPECT_FALSE(b.take(10, 2, 60000, &retry));
}

TEST(TokenBucket, ClampLowersTheTokens) {
  TokenBucket b;
  int64_t retry = 0;
  EXPECT_TRUE(b.take(1, 5, 0, &retry));  // 4 left
  b.clamp(1);
  EXPECT_TRUE(b.take(1, 1, 0, &retry));
  EXPECT_FALSE(b.take(1, 1, 0, &retry));
  EXPECT_EQ(retry, 1000);
}

}  // namespace
}  // namespace relaybus::core

namespace relaybus::core {
namespace {

TEST(ShareUse, CapThenRateThenGiveBack) {
  ShareUse u;
  HandlerOptions share;
  share.rate = 10;
  share.burst = 1;
  int64_t retry = 0;
  EXPECT_TRUE(u.take(2, share, 0, 7, &retry));
  EXPECT_FALSE(u.take(2, share, 0, 7, &retry));  // the bucket's one token is spent
  EXPECT_EQ(retry, 100);
  EXPECT_TRUE(u.take(2, share, 100, 7, &retry));
  EXPECT_EQ(u.in_use(), 2);
  EXPECT_FALSE(u.take(2, share, 10000, 7, &retry));  // the cap, whatever the tokens
  EXPECT_EQ(retry, 7);
  u.give_back();
  EXPECT_TRUE(u.take(2, share, 10000, 7, &retry));
  EXPECT_TRUE(u.take(-1, HandlerOptions{}, 10000, 7, &retry));  // no cap, no rate
  u.give_back();
  u.give_back();
  u.give_back();
  u.give_back();  // never below 0
  EXPECT_EQ(u.in_use(), 0);
}

TEST(ShareUse, HeldBackCountsAndSaysWhenItBegins) {
  ShareUse u;
  EXPECT_FALSE(u.limited(0));
  EXPECT_TRUE(u.note_held_back(3, 0));
  EXPECT_FALSE(u.note_held_back(0, 500));  // still held back: said once
  EXPECT_TRUE(u.limited(1400));
  EXPECT_FALSE(u.limited(1500));
  EXPECT_TRUE(u.note_held_back(2, 1600));
  EXPECT_EQ(u.held_back(), 5u);
}

}  // namespace
}  // namespace relaybus::core
