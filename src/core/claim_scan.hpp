// The claim scan: what a claim reads from its store, in which order, how far
// it widens, and what it remembers per handler between claims. One policy
// for every store; a store only performs the reads it is asked for.
//
// It is driven step by step ("pull"): next() says which read to perform,
// feed() hands over its rows, until next() says Done; then result() holds the
// chosen ids (plan order) and what the store must do around its leases. No
// store call happens inside this object, so a store whose reads can raise
// (PostgreSQL's SPI) performs them in frames that own no C++ objects.
//
// The policy (docs/architecture.md, "Claim scan"):
//  - A window of up to `window` rows per priority class, from a position per
//    class: a pull handler's frontier, else the handler's settled floor
//    ("the head"). The window's size comes from the hint the caller keeps per
//    handler (what the last claim needed), else 4 x max (at least 64, at
//    most scan_limit / 4).
//  - Short and a class may hold more: widen (x2 from a hint, x4 cold) up to
//    scan_limit / 4 + 1 rows per class.
//  - Short and a few keys' runs fill the window (4 or more rows per key): read
//    the heads of up to max(64, 2 x max) keys once (one index descent per
//    key) and plan over both; then widen only while the window holds unkeyed
//    rows, the key walk may have stopped early, or on every 16th claim of the
//    handler (the unkeyed probe: unkeyed rows behind hot runs wait a few
//    claims at most).
//  - A store with a cheap read of the oldest rows of all classes
//    (oldest_first) starts with it while the handler's backlog is shallow
//    (its last claim's windows all came back complete): one read instead of
//    one per class, and when it comes back short it holds every row.
//  - From the frontier: the window's keys that the store marks as possibly
//    blocked below it (ScanRow::key_below) get their first rows read too (up
//    to 64 keys per claim), so a follower never passes for its key's head.
//    Nothing more ahead of the frontier and still short: scan again from the
//    floor.
//  - A store whose fetch after leasing is not the fence (fence_in_fetch
//    false) is asked, when a window was cut short, which chosen keys have an
//    earlier seq pending outside the rows read (once per key, at its first
//    chosen seq); those keys are dropped, and a key's later chosen rows
//    follow only while their seqs are consecutive (a gap may be a pending
//    row outside the rows read).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/claim_planner.hpp"

namespace relaybus::core {

// One delivery a store read returned.
struct ScanRow {
  int64_t id = 0;
  int priority = 0;
  bool has_key = false;
  std::string key;
  int64_t ready_at_ms = 0;
  int64_t seq = 0;  // read only by stores whose ids need not follow seq (ids_follow_seq false) or that fence here
  // Blocks its key and is not taken: held by another claimer, or its lease
  // ran out without completion (expired: this claim charges it).
  bool leased = false;
  bool expired = false;
  // Window rows of a store that keeps a frontier: an earlier row of this key
  // may lie below the frontier, where a scan from it does not see it.
  bool key_below = false;
};

// What the caller keeps per handler between claims (with the same max and
// per_key): the rows per class the last claim needed, from the floor and from
// the frontier, and how many claims it made.
struct ClaimScanHint {
  int window = 0;        // 0 = none
  int window_front = 0;  // 0 = none
  uint32_t claims = 0;
  // With oldest_first: the last claim found a window full, so the next one
  // reads the class windows without the read of the oldest rows first.
  bool deep = false;
};

enum class ScanReadKind {
  Window,       // up to `window` rows per class, ascending id, from `from` (each class)
  KeyHeads,     // the first per_key rows (by seq) of up to max_keys keys (walking the key index)
  HeadsOfKeys,  // the first per_key rows (by seq) of each of `keys`
  Oldest,       // the oldest `window` rows of all classes together, ascending id
  EarlierKeys,  // which of `keys` have a row pending at a seq below `seqs[i]` (answered with feed_keys)
  Done,
};

struct ScanRead {
  ScanReadKind kind = ScanReadKind::Done;
  std::array<int64_t, 4> from{};  // Window: per class the first id; all 0 = from the very start
  int window = 0;
  bool at_floor = false;          // Window: it starts at the floor (the store notes its snapshot for the floor's rule)
  int max_keys = 0;               // KeyHeads
  int per_key = 0;                // KeyHeads, HeadsOfKeys
  std::vector<std::string> keys;  // HeadsOfKeys, EarlierKeys
  std::vector<int64_t> seqs;      // EarlierKeys
};

struct ClaimScanConfig {
  ClaimLimits limits;
  int64_t now_ms = 0;
  int64_t aging_ms = 0;   // priority aging (plan_claim)
  int scan_limit = 1000;  // the widest window, all classes together (relay.claim_scan_limit)
  // A store that keeps a frontier for this handler and has a valid one: start
  // there, else at floor.
  bool from_frontier = false;
  std::array<int64_t, 4> frontier{};
  std::array<int64_t, 4> floor{};
  // What the store can read and how it orders rows (docs/architecture.md,
  // "Claim scan"):
  // It walks its key index (KeyHeads); without, a window full of hot keys'
  // runs is widened like any other (FerretDB has no index-ordered walk).
  bool key_walk = true;
  // Its key walk also passes keys this claim cannot take (other lanes), so a
  // walk that returned fewer keys than asked does not prove every key was seen.
  bool key_walk_filtered = false;
  // Rows of a first read of the oldest rows of all classes (Oldest), 0 = it
  // has no such read that is cheaper than its class windows.
  int oldest_first = 0;
  // Rows of every class window, for a store whose reads are priced per round
  // trip rather than per row (the sidecar: four finds per window): a window
  // sized down by the hint saves little there, and each widening costs four
  // more round trips. 0 = windows sized by the hint and widened.
  int fixed_window = 0;
  // Its fetch after leasing checks every chosen row against its key's
  // earlier rows (PostgreSQL); else the scan asks EarlierKeys itself.
  bool fence_in_fetch = true;
  // A key's rows in one class window come in seq order with no earlier seq
  // of the key behind them (FerretDB's insertion order): only another
  // class's cut window can hide an earlier seq.
  bool class_window_in_seq_order = false;
  // A key's ids ascend with its seqs; else (two publishers on a MongoDB
  // without transactions) each key's ids are dealt to its rows in seq order
  // for the plan, since seq is the truth for order.
  bool ids_follow_seq = true;
};

// A taken or held keyed row the frontier may move past while a later row of
// its key in the window was neither (the key may then be blocked below it).
struct PassedRow {
  int64_t id;
  int priority;
  std::string key;
};

struct ClaimScanResult {
  std::vector<int64_t> chosen;    // hand-over order (keys as first chosen, each by seq), at most max
  bool may_have_more = false;     // short, and a window was cut: a wider read could find more
  bool heads_added = false;       // the last pass read key heads
  bool at_floor = false;          // the last window scan started at the floor
  std::array<int64_t, 4> from{};  // where the last window scan started
  // Of the last floor scan's window, per class: the first and highest id
  // (-1: none), for the floor's rule.
  std::array<int64_t, 4> first{-1, -1, -1, -1};
  std::array<int64_t, 4> highest{-1, -1, -1, -1};
  // Earliest ready_at_ms >= now of an unleased row read, 0 = none.
  int64_t next_ready_ms = 0;
  // Rows read whose expired lease the store charges before anything is handed over.
  std::vector<int64_t> expired;
  // Where the frontier may move (per class) and the passed keyed rows
  // (ascending id), when the store keeps one (see frontier_step).
  std::array<int64_t, 4> upto{};
  std::vector<PassedRow> passed;
};

class ClaimScan {
 public:
  // hint is read now and written back as the scan ends.
  ClaimScan(const ClaimScanConfig& cfg, ClaimScanHint* hint);

  const ScanRead& next() const { return read_; }
  // The rows of the read next() asked for (any order within a class is fine:
  // rows are planned in id order).
  void feed(std::vector<ScanRow> rows);
  // The answer to EarlierKeys: the keys that have an earlier seq pending.
  void feed_keys(const std::vector<std::string>& earlier);
  // Once next() is Done.
  const ClaimScanResult& result() const { return result_; }

 private:
  void start_pass();
  void ask_window();
  void after_probe();
  void after_heads();
  void end_pass();
  void conclude();
  const ScanRow* row_of_plan_id(int64_t plan_id);
  void finish();
  void plan();
  void feed_window(std::vector<ScanRow> rows);

  ClaimScanConfig cfg_;
  ClaimScanHint* hint_;
  ScanRead read_;
  ClaimScanResult result_;

  bool at_floor_ = true;  // this pass scans from the floor
  std::array<int64_t, 4> from_{};
  int* hinted_ = nullptr;
  int cap_ = 0;
  int window_ = 0;
  std::vector<ScanRow> rows_;  // this scan's window, then the rows added to it
  size_t nwindow_ = 0;
  std::array<bool, 4> truncated_{};
  std::vector<ScanRow> heads_;
  bool heads_added_ = false;
  bool more_keys_ = false;
  std::vector<ScanRow> probed_;
  std::vector<std::string> probed_keys_;
  bool probed_any_ = false;
  std::vector<ScanRow> oldest_;  // a full Oldest read, merged into the class windows
  bool oldest_asked_ = false;
  bool merged_oldest_ = false;
  std::vector<int64_t> chosen_;  // plan ids, after the fence
  ClaimPlan plan_;
  std::vector<int64_t> plan_ids_;               // per row of rows_: its id for the plan (ids_follow_seq false)
  std::unordered_map<int64_t, size_t> row_of_;  // plan id -> row of rows_, once the plan is final
  int64_t rows_needed_ = 0;
  bool exhausted_ = false;
};

// After the store leased `chosen` (got[i]: its lease was taken) and re-read
// them with a fresh snapshot: which to hand over and which leases go back.
struct FetchedRow {
  int64_t id;
  bool has_key;
  std::string key;
  int64_t seq;
  bool valid;  // ready, and every earlier row of its key is gone or in the claim
};

struct HandOver {
  // Indices into the fetched rows, in hand-over order: keys in the order they
  // were chosen, each key by seq.
  std::vector<size_t> rows;
  // Leased but not handed over, as indices into chosen (plan order), with
  // the index of their fetched row (-1: gone).
  std::vector<size_t> give_back;
  std::vector<long> give_back_row;
};

HandOver hand_over(const std::vector<int64_t>& chosen, const std::vector<bool>& got,
                   const std::vector<FetchedRow>& fetched);

}  // namespace relaybus::core
