#include "core/store_policy.hpp"

#include <gtest/gtest.h>

#include <climits>
#include <utility>

namespace relaybus::core {
namespace {

TEST(LeaseTiming, RenewEveryThirdOfTheLeaseAtLeast100ms) {
  EXPECT_EQ(lease_renew_interval_ms(30000), 10000);
  EXPECT_EQ(lease_renew_interval_ms(1000), 333);
  EXPECT_EQ(lease_renew_interval_ms(200), 100);
  EXPECT_EQ(lease_renew_interval_ms(0), 100);
}

TEST(LeaseTiming, MarginIsAFifthOfTheLeaseAtLeast200ms) {
  EXPECT_EQ(lease_margin_ms(30000), 6000);
  EXPECT_EQ(lease_margin_ms(1000), 200);
  EXPECT_EQ(lease_margin_ms(500), 200);
}

// Over the sidecar's lease_ms range (1 s .. 1 h): a renewal sent when it is
// due, and one more that fails, still leave the lease usable until the third
// interval, so one failed renewal never costs a lane's deliveries.
TEST(LeaseTiming, ARenewalDueLeavesTheMarginAhead) {
  for (int64_t lease : {1000, 1500, 3000, 10000, 30000, 60000, 3600000}) {
    const int64_t until = lease;  // renewed at 0
    EXPECT_TRUE(lease_usable(until, lease, lease_renew_interval_ms(lease))) << lease;
    EXPECT_TRUE(lease_usable(until, lease, 2 * lease_renew_interval_ms(lease))) << lease;
    EXPECT_LT(lease_margin_ms(lease), lease - 2 * lease_renew_interval_ms(lease) + 1) << lease;
  }
}

TEST(LeaseTiming, UsableOnlyBeforeTheMargin) {
  // until 10 000, margin 2 000 (lease 10 s): usable up to 7 999.
  EXPECT_TRUE(lease_usable(10000, 10000, 0));
  EXPECT_TRUE(lease_usable(10000, 10000, 7999));
  EXPECT_FALSE(lease_usable(10000, 10000, 8000));
  EXPECT_FALSE(lease_usable(10000, 10000, 10000));
  EXPECT_FALSE(lease_usable(0, 10000, 0));  // never held: until 0
}

// A renewal acknowledged after the lease stopped being usable (a stalled
// instance: another may have held the lane meanwhile) does not continue the
// tenure, even though its insert succeeded; one acknowledged in time does,
// also when it took most of the interval to come back (a slow store).
TEST(LeaseTiming, OnlyARenewalAcknowledgedInTimeKeepsTheTenure) {
  // Lease 3 s renewed at 0: until 3 000, margin 600.
  EXPECT_TRUE(renewal_keeps_tenure(3000, 3000, lease_renew_interval_ms(3000)));
  EXPECT_TRUE(renewal_keeps_tenure(3000, 3000, 2399));
  EXPECT_FALSE(renewal_keeps_tenure(3000, 3000, 2400));
  EXPECT_FALSE(renewal_keeps_tenure(3000, 3000, 3000));
  EXPECT_FALSE(renewal_keeps_tenure(3000, 3000, 11000));  // woken 8 s after the lease ran out
}

TEST(StoreErrors, LeaseCommandsPauseASecond) {
  for (StorePhase p : {StorePhase::Leases, StorePhase::Renewal}) {
    const StoreErrorPolicy s = on_store_error(p);
    EXPECT_EQ(s.after, AfterStoreError::PauseLeases);
    EXPECT_EQ(s.retry_in_ms, 1000);
  }
}

TEST(StoreErrors, AClaimErrorEndsOnlyThatHandlersTurn) {
  const StoreErrorPolicy s = on_store_error(StorePhase::Claim);
  EXPECT_EQ(s.after, AfterStoreError::NextHandler);
  EXPECT_EQ(s.retry_in_ms, 0);
}

TEST(StoreErrors, TheSequencerRetriesAfterHalfASecond) {
  const StoreErrorPolicy s = on_store_error(StorePhase::Sequence);
  EXPECT_EQ(s.after, AfterStoreError::RetryPhase);
  EXPECT_EQ(s.retry_in_ms, 500);
}

TEST(StoreErrors, CompletionsStayWithThePipeline) {
  EXPECT_EQ(on_store_error(StorePhase::Settle).after, AfterStoreError::KeepResults);
  EXPECT_EQ(on_store_error(StorePhase::Backlog).after, AfterStoreError::Skip);
}

TEST(StoreBackoff, ReadyUntilALeaseCommandFails) {
  StoreBackoff b;
  EXPECT_TRUE(b.ready(0));
  EXPECT_TRUE(b.ready(INT64_MAX));
  b.failed(5000, StorePhase::Renewal);
  EXPECT_FALSE(b.ready(5000));
  EXPECT_FALSE(b.ready(5999));
  EXPECT_TRUE(b.ready(6000));
  EXPECT_EQ(b.until_ms(), 6000);
}

TEST(StoreBackoff, OtherPhasesDoNotPauseTheLeases) {
  StoreBackoff b;
  for (StorePhase p : {StorePhase::Claim, StorePhase::Sequence, StorePhase::Settle, StorePhase::Backlog}) {
    b.failed(5000, p);
    EXPECT_TRUE(b.ready(5000));
  }
  b.failed(5000, StorePhase::Leases);
  b.failed(5500, StorePhase::Claim);  // does not shorten or lengthen the pause
  EXPECT_EQ(b.until_ms(), 6000);
}

TEST(Reconnect, DoublesFrom250msUpTo30s) {
  const std::pair<int, int64_t> cases[] = {{0, 250},   {1, 250},   {2, 500},      {3, 1000},
                                           {7, 16000}, {8, 30000}, {1000, 30000}, {INT_MAX, 30000}};
  for (const auto& [failures, ms] : cases) EXPECT_EQ(reconnect_backoff_ms(failures), ms) << failures;
}

TEST(Backlog, RefreshedEveryTenSecondsOrLease) {
  EXPECT_EQ(next_backlog_refresh_ms(1000, 3000, 0), 11000);
  EXPECT_EQ(next_backlog_refresh_ms(1000, 30000, 10), 31000);
}

TEST(Backlog, AtMostFivePercentOfTheLoop) {
  // A count that took 2 s waits 40 s: 2 / (2 + 40) < 5 %.
  EXPECT_EQ(next_backlog_refresh_ms(1000, 3000, 2000), 41000);
}

}  // namespace
}  // namespace relaybus::core
