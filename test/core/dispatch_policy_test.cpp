#include "core/dispatch_policy.hpp"

#include <gtest/gtest.h>

namespace relaybus::core {
namespace {

constexpr int kBatch = 100;

TEST(DispatchPolicy, StartsInBatchesWithNoBackoff) {
  DispatchPolicy p;
  EXPECT_TRUE(p.may_run(0));
  EXPECT_FALSE(p.isolating());
  EXPECT_EQ(p.batch_max(kBatch), kBatch);
  EXPECT_EQ(p.first_handler(3), 0);
}

TEST(DispatchPolicy, EnvironmentErrorsBackOffExponentiallyUpToFiveSeconds) {
  DispatchPolicy p;
  int64_t now = 1000000;
  const int64_t expected[] = {100, 200, 400, 800, 1600, 3200, 5000, 5000};
  for (int64_t wait : expected) {
    EXPECT_EQ(p.after_error(ErrorCause::Environment, 7, now), AfterError::Backoff);
    EXPECT_EQ(p.retry_at_ms(), now + wait);
    EXPECT_FALSE(p.may_run(now + wait - 1));
    EXPECT_TRUE(p.may_run(now + wait));
  }
  EXPECT_FALSE(p.isolating()) << "nobody's delivery is suspected";
  EXPECT_EQ(p.batch_max(kBatch), kBatch);
}

TEST(DispatchPolicy, ASuccessResetsTheEnvironmentBackoff) {
  DispatchPolicy p;
  for (int i = 0; i < 5; i++) p.after_error(ErrorCause::Environment, 0, 0);
  EXPECT_EQ(p.environment_failures(), 5);
  EXPECT_FALSE(p.after_success(false, 0));
  EXPECT_EQ(p.environment_failures(), 0);
  EXPECT_EQ(p.after_error(ErrorCause::Environment, 0, 50), AfterError::Backoff);
  EXPECT_EQ(p.retry_at_ms(), 150);
}

TEST(DispatchPolicy, AnErrorWithNothingInFlightIsTheEnvironmentsWhateverItsCause) {
  for (ErrorCause cause : {ErrorCause::Delivery, ErrorCause::Unknown}) {
    DispatchPolicy p;
    EXPECT_EQ(p.after_error(cause, 0, 0), AfterError::Backoff);
    EXPECT_FALSE(p.isolating());
    EXPECT_EQ(p.environment_failures(), 1);
  }
}

TEST(DispatchPolicy, ADeliveryErrorIsolatesAsManyAsWereInFlightAfterAShortPause) {
  for (ErrorCause cause : {ErrorCause::Delivery, ErrorCause::Unknown}) {
    DispatchPolicy p;
    EXPECT_EQ(p.after_error(cause, 3, 1000), AfterError::Isolate);
    EXPECT_EQ(p.retry_at_ms(), 1000 + kEnvironmentBackoff.base_ms);
    EXPECT_TRUE(p.isolating());
    EXPECT_EQ(p.isolation_left(), 3);
    EXPECT_EQ(p.batch_max(kBatch), 1);
    EXPECT_EQ(p.environment_failures(), 0) << "a delivery's error is no environmental failure";
  }
}

TEST(DispatchPolicy, EachDeliveryThroughAloneCountsDownThenBatchesAgain) {
  DispatchPolicy p;
  p.after_error(ErrorCause::Delivery, 2, 0);
  EXPECT_TRUE(p.after_success(true, 1)) << "the next one goes at once";
  EXPECT_TRUE(p.isolating());
  EXPECT_FALSE(p.after_success(true, 0)) << "nothing handed over: no count, no hurry";
  EXPECT_EQ(p.isolation_left(), 1);
  EXPECT_TRUE(p.after_success(true, 1));
  EXPECT_FALSE(p.isolating());
  EXPECT_EQ(p.batch_max(kBatch), kBatch);
}

TEST(DispatchPolicy, ADeliveryThatFailsAloneIsNackedAndBatchesResume) {
  DispatchPolicy p;
  p.after_error(ErrorCause::Delivery, 5, 0);
  p.after_success(true, 1);
  EXPECT_EQ(p.after_error(ErrorCause::Delivery, 1, 10), AfterError::NackPoison);
  EXPECT_FALSE(p.isolating());
  EXPECT_EQ(p.retry_at_ms(), 10 + kEnvironmentBackoff.base_ms);
  EXPECT_EQ(p.batch_max(kBatch), kBatch);
}

TEST(DispatchPolicy, ALoneFailureOutsideIsolationIsolatesFirst) {
  // One delivery in a batch of one is no proof: the error may have come from
  // the batch's other work; it goes through isolation like any other.
  DispatchPolicy p;
  EXPECT_EQ(p.after_error(ErrorCause::Delivery, 1, 0), AfterError::Isolate);
  EXPECT_EQ(p.isolation_left(), 1);
}

TEST(DispatchPolicy, AnEnvironmentErrorWhileIsolatingKeepsIsolating) {
  DispatchPolicy p;
  p.after_error(ErrorCause::Delivery, 4, 0);
  EXPECT_EQ(p.after_error(ErrorCause::Environment, 1, 0), AfterError::Backoff);
  EXPECT_TRUE(p.isolating());
  EXPECT_EQ(p.isolation_left(), 4);
}

TEST(DispatchPolicy, IsolatingTheHandlersTakeTurns) {
  DispatchPolicy p;
  p.took_turn(2);
  EXPECT_EQ(p.first_handler(3), 0) << "in batches every iteration starts with the first handler";
  p.after_error(ErrorCause::Delivery, 3, 0);
  EXPECT_EQ(p.first_handler(3), 0);
  p.took_turn(0);  // handler 0 handed one over
  p.after_success(true, 1);
  EXPECT_EQ(p.first_handler(3), 1);
  p.took_turn(1);  // handler 1 had none,
  p.took_turn(2);  // handler 2 handed one over
  p.after_success(true, 1);
  EXPECT_EQ(p.first_handler(3), 0) << "wraps around";
  EXPECT_EQ(p.first_handler(2), 1) << "taken modulo the handlers served now (one was dropped)";
}

TEST(DispatchPolicy, WhenNoSuspectIsLeftBatchesResume) {
  DispatchPolicy p;
  p.after_error(ErrorCause::Unknown, 1000, 0);
  p.after_success(true, 1);
  EXPECT_EQ(p.isolation_left(), 999);
  p.suspects_gone();
  EXPECT_FALSE(p.isolating());
  EXPECT_EQ(p.batch_max(500), 500);
  EXPECT_EQ(p.after_error(ErrorCause::Delivery, 1, 0), AfterError::Isolate)
      << "a lone failure after that isolates again instead of nacking";
}

}  // namespace
}  // namespace relaybus::core
