#include "core/claim_planner.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <string>
#include <vector>

namespace relaybus::core {
namespace {

using Ids = std::vector<int64_t>;
using Streams = std::array<std::vector<ClaimRow>, 4>;

constexpr int64_t kNow = 1'000'000'000;
constexpr bool kNoTrunc[4] = {false, false, false, false};

// A ready, unleased row; key nullptr = unkeyed. ready_at defaults to 1s ago.
ClaimRow row(int64_t id, int prio, const char* key, int64_t ready_at = kNow - 1000, bool leased = false) {
  return ClaimRow{id, prio, key != nullptr, key ? key : "", ready_at, leased};
}

// Puts rows into their class stream, each ascending by id as a scan returns them.
Streams streams_of(std::vector<ClaimRow> rows) {
  Streams s;
  for (auto& r : rows) s[std::clamp(r.priority, 0, 3)].push_back(std::move(r));
  for (auto& v : s) std::sort(v.begin(), v.end(), [](const ClaimRow& a, const ClaimRow& b) { return a.id < b.id; });
  return s;
}

ClaimPlan plan(const std::vector<ClaimRow>& rows, int max = 100, int per_key = 1, int64_t aging_ms = 0,
               std::array<bool, 4> truncated = {false, false, false, false}) {
  return plan_claim(streams_of(rows), truncated, ClaimLimits{max, per_key}, kNow, aging_ms);
}

TEST(PlanClaim, EmptyInput) {
  const ClaimPlan p = plan({});
  EXPECT_TRUE(p.ids.empty());
  EXPECT_FALSE(p.may_have_more);
  // A truncated empty stream can only mean rows beyond the scan.
  EXPECT_TRUE(plan({}, 100, 1, 0, {false, true, false, false}).may_have_more);
}

TEST(PlanClaim, HigherClassesFirstAcrossKeys) {
  const ClaimPlan p =
      plan({row(1, 1, "a"), row(2, 3, "b"), row(3, 2, "c"), row(4, 0, "d"), row(5, 3, nullptr), row(6, 1, nullptr)});
  EXPECT_EQ(p.ids, (Ids{2, 5, 3, 1, 6, 4}));
}

TEST(PlanClaim, WithinAClassAscendingId) {
  const ClaimPlan p = plan({row(9, 2, "x"), row(3, 2, "y"), row(5, 2, nullptr)});
  EXPECT_EQ(p.ids, (Ids{3, 5, 9}));
}

TEST(PlanClaim, AgingLiftsLowClassAboveFreshHighClasses) {
  const int64_t aging = 1000;
  // Waited 3.5 agings: class 0 + 3 -> 3, tied with a fresh class 3 row, and
  // it has the older ready_at, so it goes first.
  const ClaimPlan p = plan({row(1, 0, "old", kNow - 3500), row(2, 3, "fresh3", kNow), row(3, 2, "fresh2", kNow),
                            row(4, 0, "young", kNow - 500)},
                           100, 1, aging);
  EXPECT_EQ(p.ids, (Ids{1, 2, 3, 4}));
}

TEST(PlanClaim, PartialAgingLandsBetweenClasses) {
  // Class 0 aged by 2 -> effective 2: after fresh class 3, and before a
  // fresh class 2 row because it has been ready longer.
  const ClaimPlan p = plan({row(1, 3, "a", kNow), row(2, 2, "b", kNow), row(3, 0, "c", kNow - 2999)}, 100, 1, 1000);
  EXPECT_EQ(p.ids, (Ids{1, 3, 2}));
}

TEST(PlanClaim, NoAgingWhenDisabled) {
  const Ids expected{2, 1};
  EXPECT_EQ(plan({row(1, 0, "a", 0), row(2, 1, "b", kNow)}, 100, 1, 0).ids, expected);
  EXPECT_EQ(plan({row(1, 0, "a", 0), row(2, 1, "b", kNow)}, 100, 1, -5).ids, expected);
}

TEST(PlanClaim, EffectivePriorityIsCappedAt3) {
  // Both end at 3 (no bonus beyond); equal ready_at, so the lower id wins.
  const ClaimPlan p =
      plan({row(7, 2, nullptr, kNow - 50000), row(3, 1, nullptr, kNow - 50000), row(1, 3, nullptr, kNow - 10)}, 100, 1,
           1000);
  EXPECT_EQ(p.ids, (Ids{3, 7, 1}));
}

TEST(PlanClaim, TieBreaksOlderReadyAtThenLowerId) {
  // Class 1 aged +1 and fresh class 2 both have effective priority 2.
  const ClaimPlan older_first = plan({row(10, 1, nullptr, kNow - 1500), row(5, 2, nullptr, kNow - 100)}, 100, 1, 1000);
  EXPECT_EQ(older_first.ids, (Ids{10, 5}));
  const ClaimPlan lower_id_first =
      plan({row(10, 1, nullptr, kNow - 1500), row(5, 2, nullptr, kNow - 1500)}, 100, 1, 1000);
  // Same ready_at, but class 2 also ages by 1 -> 3 > 2.
  EXPECT_EQ(lower_id_first.ids, (Ids{5, 10}));
  const ClaimPlan capped = plan({row(10, 2, nullptr, kNow - 5000), row(5, 3, nullptr, kNow - 5000)}, 100, 1, 1000);
  EXPECT_EQ(capped.ids, (Ids{5, 10}));
}

TEST(PlanClaim, PerKeyOneTakesOnlyTheHead) {
  const ClaimPlan p = plan({row(1, 1, "a"), row(2, 1, "a"), row(3, 1, "a"), row(4, 1, "b"), row(5, 1, "b")});
  EXPECT_EQ(p.ids, (Ids{1, 4}));
}

TEST(PlanClaim, PerKeyThreeTakesRunsInIdOrder) {
  const ClaimPlan p =
      plan({row(1, 1, "a"), row(2, 1, "a"), row(3, 1, "a"), row(4, 1, "a"), row(5, 1, "b"), row(6, 1, "b")}, 100, 3);
  EXPECT_EQ(p.ids, (Ids{1, 2, 3, 5, 6}));
}

TEST(PlanClaim, HandOverGroupsKeysByFirstChosenRow) {
  // Merge order 1(a) 2(b) 3(a) 4(u) 5(b): a first, then b, then the unkeyed 4.
  const ClaimPlan p =
      plan({row(1, 1, "a"), row(2, 1, "b"), row(3, 1, "a"), row(4, 1, nullptr), row(5, 1, "b")}, 100, 2);
  EXPECT_EQ(p.ids, (Ids{1, 3, 2, 5, 4}));
}

TEST(PlanClaim, LeasedHeadBlocksOnlyItsOwnKey) {
  const ClaimPlan p = plan(
      {row(1, 2, "a", kNow - 1000, true), row(2, 2, "a"), row(3, 2, "b"), row(4, 2, nullptr), row(5, 2, "a")}, 100, 3);
  EXPECT_EQ(p.ids, (Ids{3, 4}));
}

TEST(PlanClaim, LeasedRowInsideARunStopsTheRun) {
  // 1 and 2 were claimed with per_key 3, 1 was acked, 2 is still leased.
  const ClaimPlan p = plan({row(2, 1, "a", kNow - 1000, true), row(3, 1, "a")}, 100, 3);
  EXPECT_TRUE(p.ids.empty());
}

TEST(PlanClaim, NotReadyHeadBlocksItsKeyOnly) {
  const int64_t future = kNow + 60000;
  const ClaimPlan p =
      plan({row(1, 3, "a", future), row(2, 3, "a"), row(3, 3, nullptr), row(4, 3, "b"), row(5, 0, "a")}, 100, 5);
  EXPECT_EQ(p.ids, (Ids{3, 4}));
}

TEST(PlanClaim, ReadyAtExactlyNowIsReady) {
  EXPECT_EQ(plan({row(1, 1, "a", kNow)}).ids, (Ids{1}));
  EXPECT_TRUE(plan({row(1, 1, "a", kNow + 1)}).ids.empty());
}

TEST(PlanClaim, UnkeyedRowsBlockNothing) {
  const ClaimPlan p = plan({row(1, 2, nullptr, kNow + 5000), row(2, 2, nullptr, kNow - 1000, true), row(3, 2, nullptr),
                            row(4, 2, "a"), row(5, 2, nullptr)});
  EXPECT_EQ(p.ids, (Ids{3, 4, 5}));
}

TEST(PlanClaim, FullKeyDoesNotStopOtherKeys) {
  const ClaimPlan p = plan({row(1, 1, "a"), row(2, 1, "a"), row(3, 1, "b"), row(4, 1, "a"), row(5, 1, "c")}, 100, 1);
  EXPECT_EQ(p.ids, (Ids{1, 3, 5}));
}

TEST(PlanClaim, MaxIsRespected) {
  std::vector<ClaimRow> rows;
  for (int i = 1; i <= 20; ++i) rows.push_back(row(i, i % 4, nullptr));
  const ClaimPlan p = plan(rows, 5, 1, 0, {true, true, true, true});
  // Class 3 first: 3, 7, 11, 15, 19.
  EXPECT_EQ(p.ids, (Ids{3, 7, 11, 15, 19}));
  EXPECT_FALSE(p.may_have_more) << "a full claim has no use for a wider scan";
  EXPECT_EQ(plan(rows, 1).ids, (Ids{3}));
}

TEST(PlanClaim, MaxCountsRowsNotKeys) {
  const ClaimPlan p = plan({row(1, 1, "a"), row(2, 1, "a"), row(3, 1, "a"), row(4, 1, "b")}, 2, 10);
  EXPECT_EQ(p.ids, (Ids{1, 2}));
}

TEST(PlanClaim, MayHaveMoreOnlyWhenTruncatedAndNotFull) {
  const std::vector<ClaimRow> rows{row(1, 1, "a"), row(2, 1, "a")};
  EXPECT_FALSE(plan(rows, 100, 1).may_have_more);
  EXPECT_TRUE(plan(rows, 100, 1, 0, {false, true, false, false}).may_have_more);
  EXPECT_TRUE(plan(rows, 100, 1, 0, {true, false, false, false}).may_have_more);
  EXPECT_FALSE(plan(rows, 1, 1, 0, {true, true, true, true}).may_have_more);
}

TEST(PlanClaim, NonPositiveLimits) {
  const std::vector<ClaimRow> rows{row(1, 1, "a"), row(2, 1, "a"), row(3, 1, nullptr)};
  EXPECT_TRUE(plan(rows, 0).ids.empty());
  EXPECT_TRUE(plan(rows, -3).ids.empty());
  EXPECT_EQ(plan(rows, 100, 0).ids, (Ids{1, 3}));  // per_key < 1 counts as 1
}

TEST(PlanClaim, PriorityNeverReordersAKey) {
  // Key a: 1 in class 0, 2 in class 3. 2 must not go ahead of 1, and it must
  // not hold up 3 (class 3, other key) while it waits.
  ClaimPlan p = plan({row(1, 0, "a"), row(2, 3, "a"), row(3, 3, "b")}, 100, 2);
  EXPECT_EQ(p.ids, (Ids{3, 1, 2}));
  p = plan({row(1, 0, "a"), row(2, 3, "a"), row(3, 3, "b")}, 100, 1);
  EXPECT_EQ(p.ids, (Ids{3, 1}));
  p = plan({row(1, 0, "a"), row(2, 3, "a"), row(3, 3, "b")}, 1, 1);
  EXPECT_EQ(p.ids, (Ids{3}));
}

TEST(PlanClaim, WaitingRowFollowsItsBlockedHead) {
  // The class 0 head of key a is not ready, so the class 3 row behind it waits too.
  const ClaimPlan p = plan({row(1, 0, "a", kNow + 1000), row(2, 3, "a"), row(3, 3, "b")}, 100, 5);
  EXPECT_EQ(p.ids, (Ids{3}));
}

TEST(PlanClaim, KeySpreadOverAllClasses) {
  const ClaimPlan p =
      plan({row(1, 0, "k"), row(2, 3, "k"), row(3, 1, "k"), row(4, 2, "k"), row(5, 3, nullptr)}, 100, 10);
  EXPECT_EQ(p.ids, (Ids{5, 1, 2, 3, 4}));
}

TEST(PlanClaim, DuplicateIdsAreIgnored) {
  Streams s = streams_of({row(1, 1, "a"), row(2, 1, "a"), row(7, 0, nullptr)});
  // The same deliveries seen again in another scan.
  s[3].push_back(row(1, 3, "a"));
  s[3].push_back(row(7, 3, nullptr));
  const ClaimPlan p = plan_claim(s, {false, false, false, false}, ClaimLimits{100, 5}, kNow, 0);
  EXPECT_EQ(p.ids, (Ids{1, 2, 7}));
}

TEST(PlanClaim, UnsortedStreamStillTerminatesInKeyOrder) {
  Streams s;
  s[1] = {row(5, 1, "a"), row(3, 1, "a"), row(4, 1, nullptr)};
  const ClaimPlan p = plan_claim(s, {false, false, false, false}, ClaimLimits{100, 5}, kNow, 0);
  EXPECT_EQ(p.ids, (Ids{3, 5, 4}));
}

TEST(PlanClaim, OutOfRangePriorityIsClamped) {
  Streams s;
  s[0] = {row(1, -4, nullptr)};
  s[3] = {row(2, 9, nullptr)};
  s[2] = {row(3, 2, nullptr)};
  const ClaimPlan p = plan_claim(s, {false, false, false, false}, ClaimLimits{}, kNow, 0);
  EXPECT_EQ(p.ids, (Ids{2, 3, 1}));
}

TEST(PlanClaim, ExtremeTimesDoNotOverflow) {
  Streams s;
  s[0] = {row(1, 0, nullptr, INT64_MIN)};
  s[3] = {row(2, 3, nullptr, INT64_MAX - 1)};
  const ClaimPlan p = plan_claim(s, {false, false, false, false}, ClaimLimits{}, INT64_MAX, 1);
  EXPECT_EQ(p.ids, (Ids{1, 2}));  // both effective 3, the older first
}

TEST(PlanClaim, DefaultLimits) {
  const ClaimLimits lim;
  EXPECT_EQ(lim.max, 100);
  EXPECT_EQ(lim.per_key, 1);
  std::vector<ClaimRow> rows;
  for (int i = 1; i <= 150; ++i) rows.push_back(row(i, 1, nullptr));
  EXPECT_EQ(plan_claim(streams_of(rows), {false, false, false, false}, lim, kNow, 0).ids.size(), 100u);
}

// Random inputs against invariants that hold whatever the merge order.
TEST(PlanClaim, RandomisedInvariants) {
  uint64_t state = 0x2545F4914F6CDD1DULL;
  const auto next = [&](uint64_t n) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return static_cast<int64_t>(state % n);
  };
  for (int iter = 0; iter < 500; ++iter) {
    std::vector<ClaimRow> rows;
    const int n = static_cast<int>(next(40));
    const char* const kKeys[] = {"a", "b", "c", "d", "e"};
    for (int i = 0; i < n; ++i) {
      const bool keyed = next(4) != 0;
      const int64_t ready = kNow + (next(5) == 0 ? 1 + next(1000) : -next(100000));
      rows.push_back(row(i + 1, static_cast<int>(next(4)), keyed ? kKeys[next(5)] : nullptr, ready, next(8) == 0));
    }
    const int max = 1 + static_cast<int>(next(30));
    const int per_key = 1 + static_cast<int>(next(4));
    const ClaimPlan p = plan(rows, max, per_key, next(2) ? 0 : 1 + next(20000));
    SCOPED_TRACE("iteration " + std::to_string(iter));

    ASSERT_LE(static_cast<int>(p.ids.size()), max);
    std::vector<int64_t> sorted = p.ids;
    std::sort(sorted.begin(), sorted.end());
    ASSERT_TRUE(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end()) << "duplicate id";
    const auto chosen = [&](int64_t id) { return std::binary_search(sorted.begin(), sorted.end(), id); };
    const auto ok_row = [](const ClaimRow& r) { return r.ready_at_ms <= kNow && !r.leased; };

    for (const ClaimRow& r : rows) {
      if (chosen(r.id)) {
        EXPECT_TRUE(ok_row(r)) << "chose unready or leased row " << r.id;
      }
    }
    // Per key: the chosen rows are exactly a prefix (in id order) of the key's
    // rows, as long as the prefix is ready and unleased, and at most per_key.
    for (const char* key : kKeys) {
      std::vector<const ClaimRow*> of_key;
      for (const ClaimRow& r : rows)
        if (r.has_key && r.key == key) of_key.push_back(&r);
      size_t taken = 0;
      while (taken < of_key.size() && chosen(of_key[taken]->id)) ++taken;
      for (size_t i = taken; i < of_key.size(); ++i)
        EXPECT_FALSE(chosen(of_key[i]->id)) << "key " << key << " skipped a predecessor";
      EXPECT_LE(static_cast<int>(taken), per_key);
      if (static_cast<int>(p.ids.size()) < max) {
        // Not stopped by max: the prefix is as long as allowed.
        size_t allowed = 0;
        while (allowed < of_key.size() && static_cast<int>(allowed) < per_key && ok_row(*of_key[allowed])) ++allowed;
        EXPECT_EQ(taken, allowed) << "key " << key;
      }
      // Hand-over: one key's rows are contiguous and ascending.
      std::vector<size_t> at;
      for (size_t i = 0; i < p.ids.size(); ++i)
        for (size_t j = 0; j < taken; ++j)
          if (p.ids[i] == of_key[j]->id) at.push_back(i);
      for (size_t j = 1; j < at.size(); ++j) EXPECT_EQ(at[j], at[j - 1] + 1) << "key " << key;
      for (size_t j = 1; j < at.size(); ++j) EXPECT_LT(p.ids[at[j - 1]], p.ids[at[j]]);
    }
    if (static_cast<int>(p.ids.size()) < max) {
      for (const ClaimRow& r : rows) {
        if (!r.has_key && ok_row(r)) {
          EXPECT_TRUE(chosen(r.id)) << "missed unkeyed " << r.id;
        }
      }
    }
  }
}

// ---- finalize ------------------------------------------------------------------

CheckedRow checked(int64_t id, const char* key, bool present, bool valid) {
  return CheckedRow{id, key != nullptr, key ? key : "", present, valid};
}

TEST(FinalizeClaim, AllValidKeepsPlanOrder) {
  EXPECT_EQ(finalize_claim({checked(5, "a", true, true), checked(7, "a", true, true), checked(2, "b", true, true),
                            checked(9, nullptr, true, true)}),
            (Ids{5, 7, 2, 9}));
}

TEST(FinalizeClaim, Empty) { EXPECT_TRUE(finalize_claim({}).empty()); }

TEST(FinalizeClaim, AbsentRowsAreDroppedWithoutBlocking) {
  EXPECT_EQ(
      finalize_claim({checked(1, "a", false, false), checked(2, "a", true, true), checked(3, nullptr, false, true)}),
      (Ids{2}));
}

TEST(FinalizeClaim, InvalidKeyedRowDropsTheRestOfItsKey) {
  EXPECT_EQ(finalize_claim({checked(1, "a", true, true), checked(2, "a", true, false), checked(3, "a", true, true),
                            checked(4, "b", true, true), checked(5, "a", true, true)}),
            (Ids{1, 4}));
}

TEST(FinalizeClaim, InvalidUnkeyedRowDropsOnlyItself) {
  EXPECT_EQ(
      finalize_claim({checked(1, nullptr, true, false), checked(2, nullptr, true, true), checked(3, "", true, true)}),
      (Ids{2, 3}));
}

TEST(FinalizeClaim, EmptyStringKeyIsAKey) {
  EXPECT_EQ(finalize_claim({checked(1, "", true, false), checked(2, "", true, true), checked(3, nullptr, true, true)}),
            (Ids{3}));
}

TEST(FinalizeClaim, InvalidHeadDropsWholeKey) {
  EXPECT_EQ(finalize_claim({checked(10, "k", true, false), checked(11, "k", true, true), checked(12, "k", true, true)}),
            (Ids{}));
}

TEST(PlanClaim, TakesAKeysRunBeforeTheNextKey) {
  // Interleaved hot keys: a1 b1 a2 b2 a3 b3 a4 b4.
  std::vector<ClaimRow> rows;
  for (int i = 1; i <= 8; ++i) rows.push_back(row(i, 1, i % 2 ? "a" : "b"));
  EXPECT_EQ(plan(rows, 3, 3).ids, (Ids{1, 3, 5})) << "a's run of 3, b left for another claimer";
  EXPECT_EQ(plan(rows, 100, 3).ids, (Ids{1, 3, 5, 2, 4, 6}));
  EXPECT_EQ(plan(rows, 100, 3).rows_needed, 8);
  // The run stops at a leased row; the key is then blocked.
  rows[4].leased = true;  // a3
  EXPECT_EQ(plan(rows, 100, 3).ids, (Ids{1, 3, 2, 4, 6}));
  // A run does not jump ahead of a higher class.
  std::vector<ClaimRow> mixed = {row(1, 1, "a"), row(2, 1, "a"), row(3, 3, "b")};
  EXPECT_EQ(plan(mixed, 2, 2).ids, (Ids{3, 1}));
}

TEST(PlanClaim, RowsNeededIsTheDepthReadPerStream) {
  std::vector<ClaimRow> rows;
  for (int i = 1; i <= 20; ++i) rows.push_back(row(i, 1, nullptr));
  EXPECT_EQ(plan(rows, 5, 1).rows_needed, 5) << "filled after 5 rows of class 1";
  rows[0].leased = true;
  rows[1].leased = true;
  EXPECT_EQ(plan(rows, 5, 1).rows_needed, 7) << "two leased rows skipped";
  EXPECT_EQ(plan(rows, 100, 1).rows_needed, 20) << "not filled: the whole stream";
  // A hot key with per_key 1: one row chosen, every row read.
  std::vector<ClaimRow> hot;
  for (int i = 1; i <= 10; ++i) hot.push_back(row(i, 1, "k"));
  EXPECT_EQ(plan(hot, 5, 1).rows_needed, 10);
  hot.push_back(row(11, 2, "j"));
  hot.push_back(row(12, 2, nullptr));
  hot.push_back(row(3, 2, "k"));  // the same id again (another stream): not counted
  const ClaimPlan p = plan(hot, 5, 1);
  EXPECT_EQ(p.distinct_keys, 2);
  EXPECT_EQ(p.keyed_rows, 11);
  EXPECT_EQ(p.unkeyed_rows, 1);
}

}  // namespace
}  // namespace relaybus::core
