#include "core/claim_scan.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace relaybus::core {
namespace {

using Ids = std::vector<int64_t>;

constexpr int64_t kNow = 1'000'000'000;

// A handler's deliveries in memory, answering the scan's reads as the
// PostgreSQL store's statements do (a key's seq order is its id order here).
struct Table {
  struct Row {
    int64_t id;
    int priority;
    std::string key;  // "" = unkeyed
    int64_t ready_at_ms = kNow - 1000;
    bool leased = false;
    bool expired = false;
    int64_t seq = 0;  // 0: the id
  };
  std::vector<Row> rows;
  std::set<std::string> below;  // keys the store's frontier marks
  std::vector<ScanRead> reads;  // every read performed

  void add(int64_t id, int priority = 0, const std::string& key = "") { rows.push_back(Row{id, priority, key}); }
  Row& at(int64_t id) {
    for (auto& r : rows)
      if (r.id == id) return r;
    throw std::out_of_range("no row");
  }

  ScanRow out(const Row& r, bool window) const {
    ScanRow s;
    s.id = r.id;
    s.priority = r.priority;
    s.has_key = !r.key.empty();
    s.key = r.key;
    s.ready_at_ms = r.ready_at_ms;
    s.seq = r.seq != 0 ? r.seq : r.id;
    s.leased = r.leased || r.expired;
    s.expired = r.expired;
    s.key_below = window && s.has_key && below.count(r.key) > 0;
    return s;
  }
  std::vector<Row> sorted() const {
    std::vector<Row> s = rows;
    std::sort(s.begin(), s.end(), [](const Row& a, const Row& b) { return a.id < b.id; });
    return s;
  }
  std::vector<ScanRow> perform(const ScanRead& rd) {
    reads.push_back(rd);
    std::vector<ScanRow> got;
    const auto all = sorted();
    switch (rd.kind) {
      case ScanReadKind::Window:
        for (int p = 3; p >= 0; p--) {
          int n = 0;
          for (const auto& r : all)
            if (r.priority == p && r.id >= rd.from[p] && n < rd.window) {
              got.push_back(out(r, true));
              n++;
            }
        }
        break;
      case ScanReadKind::KeyHeads: {
        std::map<std::string, std::vector<Row>> by_key;
        for (const auto& r : all)
          if (!r.key.empty()) by_key[r.key].push_back(r);
        int keys = 0;
        for (const auto& [k, run] : by_key) {
          if (keys++ >= rd.max_keys) break;
          for (int i = 0; i < rd.per_key && i < static_cast<int>(run.size()); i++) got.push_back(out(run[i], false));
        }
        break;
      }
      case ScanReadKind::Oldest:
        for (const auto& r : all)
          if (static_cast<int>(got.size()) < rd.window) got.push_back(out(r, true));
        break;
      case ScanReadKind::EarlierKeys:
        break;
      case ScanReadKind::HeadsOfKeys:
        for (const auto& k : rd.keys) {
          int n = 0;
          for (const auto& r : all)
            if (r.key == k && n++ < rd.per_key) got.push_back(out(r, false));
        }
        break;
      case ScanReadKind::Done:
        break;
    }
    return got;
  }
  // EarlierKeys: the keys with a row below the given seq.
  std::vector<std::string> earlier(const ScanRead& rd) {
    reads.push_back(rd);
    std::vector<std::string> found;
    for (size_t i = 0; i < rd.keys.size(); i++)
      for (const auto& r : rows)
        if (r.key == rd.keys[i] && (r.seq != 0 ? r.seq : r.id) < rd.seqs[i]) {
          found.push_back(r.key);
          break;
        }
    return found;
  }
  std::vector<int> windows() const {
    std::vector<int> w;
    for (const auto& r : reads) w.push_back(r.window);
    return w;
  }
  int count(ScanReadKind kind) const {
    return static_cast<int>(
        std::count_if(reads.begin(), reads.end(), [&](const ScanRead& r) { return r.kind == kind; }));
  }
};

ClaimScanConfig config(int max, int per_key = 1) {
  ClaimScanConfig c;
  c.limits = ClaimLimits{max, per_key};
  c.now_ms = kNow;
  c.scan_limit = 1000;
  return c;
}

ClaimScanResult run(Table& t, const ClaimScanConfig& cfg, ClaimScanHint* hint) {
  ClaimScan scan(cfg, hint);
  for (int guard = 0; scan.next().kind != ScanReadKind::Done; guard++) {
    if (guard > 100) throw std::runtime_error("scan does not end");
    if (scan.next().kind == ScanReadKind::EarlierKeys)
      scan.feed_keys(t.earlier(scan.next()));
    else
      scan.feed(t.perform(scan.next()));
  }
  return scan.result();
}

Ids range(int64_t from, int64_t to) {
  Ids v;
  for (int64_t i = from; i <= to; i++) v.push_back(i);
  return v;
}

// Unkeyed rows 1..n, the first `held` of them leased by other claimers.
Table held_backlog(int n, int held) {
  Table t;
  for (int i = 1; i <= n; i++) t.add(i);
  for (int i = 1; i <= held; i++) t.at(i).leased = true;
  return t;
}

TEST(ClaimScan, ColdStartReadsOneWindowOfFourTimesMax) {
  Table t = held_backlog(1000, 0);
  ClaimScanHint hint;
  const auto r = run(t, config(10), &hint);
  EXPECT_EQ(r.chosen, range(1, 10));
  ASSERT_EQ(t.reads.size(), 1u);
  EXPECT_EQ(t.reads[0].window, 64);  // 4 x 10, at least 64
  EXPECT_TRUE(t.reads[0].at_floor);
  EXPECT_EQ(hint.window, 10 + 10 / 8 + 8);  // what it needed, a little more
  EXPECT_EQ(hint.claims, 1u);
}

TEST(ClaimScan, WidensPastHeldRowsUpToTheLimit) {
  Table t = held_backlog(1000, 200);
  ClaimScanHint hint;
  EXPECT_EQ(run(t, config(10), &hint).chosen, range(201, 210));
  EXPECT_EQ(t.windows(), (std::vector<int>{64, 251}));  // x4, capped at scan_limit / 4 + 1
  EXPECT_EQ(hint.window, 210 + 210 / 8 + 8);

  // The next claim starts at the window the last one needed, and a hinted
  // window that falls short doubles.
  for (int i = 201; i <= 240; i++) t.at(i).leased = true;
  t.reads.clear();
  EXPECT_EQ(run(t, config(10), &hint).chosen, range(241, 250));
  EXPECT_EQ(t.windows(), (std::vector<int>{244, 251}));
}

TEST(ClaimScan, StopsWideningAtTheScanLimit) {
  Table t = held_backlog(1000, 900);
  ClaimScanHint hint;
  const auto r = run(t, config(10), &hint);
  EXPECT_TRUE(r.chosen.empty());
  EXPECT_EQ(t.count(ScanReadKind::Window), 2);  // 64, then 251: 251 x 4 >= 1000
}

TEST(ClaimScan, HotKeysReadKeyHeadsBeyondTheWindow) {
  Table t;  // 20 keys, each a run of 100 rows: the window holds one key's run
  for (int k = 0; k < 20; k++)
    for (int i = 1; i <= 100; i++) t.add(k * 100 + i, 0, "k" + std::to_string(k));
  ClaimScanHint hint;
  hint.claims = 1;
  const auto r = run(t, config(16), &hint);
  ASSERT_EQ(r.chosen.size(), 16u);
  EXPECT_TRUE(r.heads_added);
  EXPECT_EQ(t.count(ScanReadKind::KeyHeads), 1);
  EXPECT_EQ(t.count(ScanReadKind::Window), 1);  // the heads do the finding: no widening
  EXPECT_EQ(t.reads[1].max_keys, 64);
  std::set<int64_t> chosen(r.chosen.begin(), r.chosen.end());
  for (int64_t id : r.chosen) EXPECT_EQ((id - 1) % 100, 0) << id;  // only keys' heads
  EXPECT_TRUE(chosen.count(1501));                                 // far past the window
  // The next window starts at max, not at the depth of the runs.
  EXPECT_EQ(hint.window, 16 + 16 / 8 + 8);
}

TEST(ClaimScan, UnkeyedRowsBehindHotRunsAreProbedEverySixteenthClaim) {
  Table t;
  for (int i = 1; i <= 200; i++) t.add(i, 0, "a");
  for (int i = 201; i <= 205; i++) t.add(i);
  for (int i = 206; i <= 405; i++) t.add(i, 0, "b");
  ClaimScanHint hint;
  hint.claims = 1;
  auto r = run(t, config(10), &hint);
  EXPECT_EQ(r.chosen, (Ids{1, 206}));  // heads only: no widening on this claim
  EXPECT_EQ(t.count(ScanReadKind::Window), 1);

  ClaimScanHint probe;
  probe.claims = 16;
  t.reads.clear();
  r = run(t, config(10), &probe);
  std::set<int64_t> got(r.chosen.begin(), r.chosen.end());
  EXPECT_EQ(got, (std::set<int64_t>{1, 201, 202, 203, 204, 205, 206}));
  EXPECT_EQ(t.count(ScanReadKind::Window), 2);
  EXPECT_EQ(t.count(ScanReadKind::KeyHeads), 1);  // once per pass, kept for the wider window
}

// Key "a"'s run of `run` rows (ids 1..run), then `unkeyed` unkeyed rows.
Table hot_run(int run, int unkeyed) {
  Table t;
  for (int i = 1; i <= run; i++) t.add(i, 0, "a");
  for (int i = run + 1; i <= run + unkeyed; i++) t.add(i);
  return t;
}

TEST(ClaimScan, ShortKeyWalkWithLaneFilterKeepsWidening) {
  Table t = hot_run(200, 5);
  ClaimScanHint hint;
  hint.claims = 1;
  ClaimScanConfig cfg = config(10);
  cfg.key_walk_filtered = true;  // a walk of 1 key proves nothing
  const auto r = run(t, cfg, &hint);
  EXPECT_EQ(r.chosen, (Ids{1, 201, 202, 203, 204, 205}));
  EXPECT_EQ(t.count(ScanReadKind::Window), 2);
}

TEST(ClaimScan, FrontierScanReadsHeadsOfKeysBlockedBelowIt) {
  Table t;
  t.add(5, 0, "k");
  t.at(5).leased = true;  // held below the frontier
  for (int i = 10; i <= 20; i++) t.add(i, 0, i == 12 ? "k" : "");
  t.below = {"k"};
  ClaimScanHint hint;
  ClaimScanConfig cfg = config(5);  // filled from the frontier: no scan from the floor
  cfg.from_frontier = true;
  cfg.frontier = {10, 10, 10, 10};
  const auto r = run(t, cfg, &hint);
  EXPECT_EQ(r.chosen, (Ids{10, 11, 13, 14, 15}));  // k's follower is not its head
  ASSERT_EQ(t.count(ScanReadKind::HeadsOfKeys), 1);
  EXPECT_EQ(t.reads[1].keys, (std::vector<std::string>{"k"}));

  // Without the mark the follower passes for the head (what the fence is for).
  t.below.clear();
  t.reads.clear();
  ClaimScanHint h2;
  const auto r2 = run(t, cfg, &h2);
  EXPECT_EQ(r2.chosen, (Ids{10, 11, 12, 13, 14}));
  EXPECT_EQ(t.count(ScanReadKind::HeadsOfKeys), 0);
}

TEST(ClaimScan, FrontierWithNothingAheadScansFromTheFloor) {
  Table t;
  for (int i = 1; i <= 5; i++) t.add(i);  // put back below the frontier
  ClaimScanHint hint;
  ClaimScanConfig cfg = config(10);
  cfg.from_frontier = true;
  cfg.frontier = {100, 100, 100, 100};
  const auto r = run(t, cfg, &hint);
  EXPECT_EQ(r.chosen, range(1, 5));
  ASSERT_EQ(t.reads.size(), 2u);
  EXPECT_FALSE(t.reads[0].at_floor);
  EXPECT_TRUE(t.reads[1].at_floor);
  EXPECT_EQ(t.reads[1].from, (std::array<int64_t, 4>{0, 0, 0, 0}));
  EXPECT_TRUE(r.at_floor);
  EXPECT_EQ(r.first, (std::array<int64_t, 4>{1, -1, -1, -1}));
  EXPECT_EQ(r.highest, (std::array<int64_t, 4>{5, -1, -1, -1}));
  EXPECT_GT(hint.window_front, 0);
  EXPECT_GT(hint.window, 0);
}

TEST(ClaimScan, FrontierShortBecauseOfHeldRowsDoesNotLookBehind) {
  Table t;
  t.add(1);  // below the frontier
  for (int i = 100; i <= 499; i++) t.add(i);
  for (int i = 100; i <= 449; i++) t.at(i).leased = true;
  ClaimScanHint hint;
  ClaimScanConfig cfg = config(10);
  cfg.from_frontier = true;
  cfg.frontier = {100, 100, 100, 100};
  const auto r = run(t, cfg, &hint);
  EXPECT_TRUE(r.chosen.empty());  // widened to the limit, every row read held
  EXPECT_EQ(t.count(ScanReadKind::Window), 2);
  EXPECT_FALSE(r.at_floor);
  EXPECT_FALSE(t.reads[1].at_floor);
}

TEST(ClaimScan, PrioritiesAreReadPerClassAndMerged) {
  Table t;
  for (int i = 1; i <= 100; i++) t.add(i, 0);
  for (int i = 101; i <= 103; i++) t.add(i, 3);
  t.add(104, 2);
  ClaimScanHint hint;
  const auto r = run(t, config(5), &hint);
  EXPECT_EQ(r.chosen, (Ids{101, 102, 103, 104, 1}));
  ASSERT_EQ(t.reads.size(), 1u);
}

TEST(ClaimScan, PerKeyTakesRunsOfAKey) {
  Table t;
  for (int i = 1; i <= 30; i++) t.add(i, 0, i % 2 ? "a" : "b");
  ClaimScanHint hint;
  const auto r = run(t, config(6, 3), &hint);
  EXPECT_EQ(r.chosen, (Ids{1, 3, 5, 2, 4, 6}));
}

TEST(ClaimScan, NextReadyAndExpiredLeases) {
  Table t;
  t.add(1);
  t.at(1).ready_at_ms = kNow + 5000;
  t.add(2);
  t.at(2).ready_at_ms = kNow + 3000;
  t.add(3, 0, "k");
  t.at(3).expired = true;
  t.add(4, 0, "k");
  t.add(5);
  ClaimScanHint hint;
  const auto r = run(t, config(10), &hint);
  EXPECT_EQ(r.chosen, (Ids{5}));  // 4 waits behind its key's expired head
  EXPECT_EQ(r.next_ready_ms, kNow + 3000);
  EXPECT_EQ(r.expired, (Ids{3}));
}

TEST(ClaimScan, FrontierStepPassesTakenAndHeldRows) {
  Table t;
  t.add(10, 0, "k");
  t.at(10).leased = true;
  t.add(11);
  t.add(12, 0, "k");  // blocked behind 10: free, not chosen
  t.add(13);
  ClaimScanHint hint;
  ClaimScanConfig cfg = config(2);
  cfg.from_frontier = true;
  cfg.frontier = {10, 10, 10, 10};
  const auto r = run(t, cfg, &hint);
  EXPECT_EQ(r.chosen, (Ids{11, 13}));
  EXPECT_EQ(r.upto[0], 12);  // the first free row not chosen
  EXPECT_EQ(r.upto[1], 10);  // nothing seen: stays
  ASSERT_EQ(r.passed.size(), 1u);
  EXPECT_EQ(r.passed[0].id, 10);
  EXPECT_EQ(r.passed[0].key, "k");
}

TEST(ClaimScan, HintIsPerPassAndShrinksSlowly) {
  Table t = held_backlog(1000, 0);
  ClaimScanHint hint;
  hint.window = 200;
  const auto r = run(t, config(10), &hint);
  EXPECT_EQ(r.chosen, range(1, 10));
  EXPECT_EQ(t.reads[0].window, 200);
  EXPECT_EQ(hint.window, 200 - 200 / 16);
  EXPECT_EQ(hint.window_front, 0);
}

// A store like the MongoDB sidecar's: a cheap read of the oldest rows of all
// classes, no key walk, no fence in its fetch.
ClaimScanConfig sidecar(int max, int per_key = 1) {
  ClaimScanConfig c = config(max, per_key);
  c.oldest_first = 256;
  c.fixed_window = 128;
  c.key_walk = false;
  c.fence_in_fetch = false;
  c.ids_follow_seq = false;
  return c;
}

TEST(ClaimScanSidecar, ShallowBacklogIsOneReadOfTheOldestRows) {
  Table t;
  for (int i = 1; i <= 100; i++) t.add(i, i % 4, i % 3 ? "k" + std::to_string(i % 7) : "");
  ClaimScanHint hint;
  const auto r = run(t, sidecar(10), &hint);
  ASSERT_EQ(t.reads.size(), 1u);  // every row of every class: no window cut, no fence
  EXPECT_EQ(t.reads[0].kind, ScanReadKind::Oldest);
  EXPECT_EQ(r.chosen.size(), 10u);
  EXPECT_FALSE(hint.deep);
  EXPECT_FALSE(r.may_have_more);
}

TEST(ClaimScanSidecar, DeepBacklogReadsClassWindowsAndRemembersIt) {
  Table t;
  for (int i = 1; i <= 1000; i++) t.add(i, 1);
  for (int i = 1001; i <= 1010; i++) t.add(i, 3);  // far behind the oldest rows
  ClaimScanHint hint;
  auto r = run(t, sidecar(10), &hint);
  EXPECT_EQ(r.chosen, range(1001, 1010));
  ASSERT_EQ(t.reads.size(), 2u);
  EXPECT_EQ(t.reads[0].kind, ScanReadKind::Oldest);
  EXPECT_EQ(t.reads[1].kind, ScanReadKind::Window);
  EXPECT_TRUE(hint.deep);
  for (int i = 1001; i <= 1010; i++) t.at(i).leased = true;
  t.reads.clear();
  r = run(t, sidecar(10), &hint);  // straight to the class windows
  EXPECT_EQ(r.chosen, range(1, 10));
  ASSERT_EQ(t.reads.size(), 1u);
  EXPECT_EQ(t.reads[0].kind, ScanReadKind::Window);

  // Once the class windows come back whole, the next claim reads the oldest rows first again.
  t.rows.resize(5);
  t.reads.clear();
  run(t, sidecar(10), &hint);
  EXPECT_FALSE(hint.deep);
  t.reads.clear();
  run(t, sidecar(10), &hint);
  EXPECT_EQ(t.reads[0].kind, ScanReadKind::Oldest);
}

TEST(ClaimScan, WithoutAKeyWalkHotKeysWiden) {
  Table t = hot_run(300, 10);
  ClaimScanHint hint;
  hint.claims = 1;
  ClaimScanConfig cfg = config(5);
  cfg.scan_limit = 512;
  cfg.key_walk = false;
  const auto r = run(t, cfg, &hint);
  EXPECT_EQ(t.count(ScanReadKind::KeyHeads), 0);
  EXPECT_EQ(t.windows(), (std::vector<int>{64, 129}));  // up to the cap
  EXPECT_EQ(r.chosen, (Ids{1}));                        // the unkeyed rows lie past the widest window
}

TEST(ClaimScanSidecar, FixedWindowsAreNeitherSizedByTheHintNorWidened) {
  Table t = hot_run(300, 10);
  ClaimScanHint hint;
  hint.deep = true;
  hint.window = 20;
  const auto r = run(t, sidecar(5), &hint);
  EXPECT_EQ(t.count(ScanReadKind::Window), 1);
  EXPECT_EQ(t.reads[0].window, 128);
  EXPECT_EQ(r.chosen, (Ids{1}));
  EXPECT_TRUE(r.may_have_more);
}

TEST(ClaimScanSidecar, FenceDropsKeysWithAnEarlierSeqOutsideAndGaps) {
  Table t;
  // Class 0 is cut: key "x" has an earlier seq in a row past its window.
  for (int i = 1; i <= 100; i++) t.add(i, 0, "u" + std::to_string(i));
  t.add(101, 1, "x");
  t.at(101).seq = 5;
  t.add(200, 0, "x");
  t.at(200).seq = 4;  // pending, not read
  // Key "y": seqs 1, 2 read, 4 read, 3 pending outside: 4 must not follow 2.
  t.add(102, 1, "y");
  t.at(102).seq = 1;
  t.add(103, 1, "y");
  t.at(103).seq = 2;
  t.add(104, 1, "y");
  t.at(104).seq = 4;
  ClaimScanHint hint;
  hint.deep = true;
  ClaimScanConfig cfg = sidecar(4, 3);
  cfg.fixed_window = 64;
  const auto r = run(t, cfg, &hint);
  ASSERT_EQ(t.count(ScanReadKind::EarlierKeys), 1);
  const ScanRead& fence = t.reads.back();
  EXPECT_EQ(fence.keys, (std::vector<std::string>{"x", "y"}));  // once per key, at its first chosen seq
  EXPECT_EQ(fence.seqs, (std::vector<int64_t>{5, 1}));
  EXPECT_EQ(r.chosen, (Ids{102, 103}));
}

TEST(ClaimScanSidecar, InsertionOrderFencesOnlyAcrossCutClasses) {
  Table t;
  for (int i = 1; i <= 100; i++) t.add(i, 0, "k");  // class 0 cut
  t.add(101, 1, "m");
  t.add(102, 2, "n");
  ClaimScanHint hint;
  hint.deep = true;
  ClaimScanConfig cfg = sidecar(3);
  cfg.fixed_window = 64;
  cfg.class_window_in_seq_order = true;
  const auto r = run(t, cfg, &hint);
  ASSERT_EQ(t.count(ScanReadKind::EarlierKeys), 1);
  // k's earlier seqs come first in its own class's window: not asked.
  EXPECT_EQ(t.reads.back().keys, (std::vector<std::string>{"n", "m"}));
  EXPECT_EQ(r.chosen.size(), 3u);
}

TEST(ClaimScanSidecar, KeyOrderFollowsSeqNotId) {
  Table t;
  t.add(5, 0, "k");
  t.at(5).seq = 2;
  t.add(7, 0, "k");
  t.at(7).seq = 1;  // drew a higher id but the lower seq
  t.add(6);
  ClaimScanHint hint;
  const auto r = run(t, sidecar(10, 2), &hint);
  EXPECT_EQ(r.chosen, (Ids{7, 5, 6}));
}

TEST(HandOver, KeysInChosenOrderEachBySeqAndFencedKeysGiveBack) {
  const Ids chosen = {3, 1, 4, 7, 8};
  const std::vector<bool> got = {true, true, true, false, true};
  const std::vector<FetchedRow> fetched = {
      {1, false, "", 0, true}, {3, true, "k", 1, true}, {4, true, "k", 2, true},
      {7, true, "m", 1, true}, {8, true, "m", 2, true},
  };
  const HandOver h = hand_over(chosen, got, fetched);
  std::vector<int64_t> ids;
  for (size_t r : h.rows) ids.push_back(fetched[r].id);
  EXPECT_EQ(ids, (Ids{3, 4, 1}));  // m lost its head's lease: its follower goes back
  EXPECT_EQ(h.give_back, (std::vector<size_t>{4}));
  EXPECT_EQ(h.give_back_row, (std::vector<long>{4}));
}

TEST(HandOver, GoneRowsAreLeftOutAndInvalidOnesGoBack) {
  const Ids chosen = {1, 2, 3};
  const std::vector<bool> got = {true, true, true};
  const std::vector<FetchedRow> fetched = {{2, true, "k", 5, false}, {3, true, "k", 6, true}};
  const HandOver h = hand_over(chosen, got, fetched);
  EXPECT_TRUE(h.rows.empty());
  EXPECT_EQ(h.give_back, (std::vector<size_t>{0, 1, 2}));
  EXPECT_EQ(h.give_back_row, (std::vector<long>{-1, 0, 1}));
}

}  // namespace
}  // namespace relaybus::core
