// The harness's data model: cells, what a child process does, and the records
// children leave behind for the parent (receipts for the exactness check,
// publish records for latency).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "util.hpp"

namespace bench {

enum class Group { Publish, Dispatch, Mixed };
enum class Keys { None, Distinct1000, Hot10, Hot1 };

inline const char* group_name(Group g) {
  return g == Group::Publish ? "publish" : (g == Group::Dispatch ? "dispatch" : "mixed");
}
inline const char* keys_name(Keys k) {
  switch (k) {
    case Keys::None:
      return "unkeyed";
    case Keys::Distinct1000:
      return "keys1000";
    case Keys::Hot10:
      return "hot10";
    case Keys::Hot1:
      return "hot1";
  }
  return "?";
}
inline int keys_count(Keys k) {
  switch (k) {
    case Keys::None:
      return 0;
    case Keys::Distinct1000:
      return 1000;
    case Keys::Hot10:
      return 10;
    case Keys::Hot1:
      return 1;
  }
  return 0;
}

// One cell: a system (relaybus, the floor, later a peer) doing one workload.
// A run is one build (install tree) x a list of cells; A/B later interleaves two
// builds over the same list.
struct Cell {
  std::string name;
  Group group = Group::Publish;
  std::string system;                // "relaybus" | "floor" (peers: "pgq", "graphile", ...)
  std::string variant;               // relaybus: "publish" | "pull" | "notify-fire" | "notify-ack";
                                     // floor: "insert" | "delete" | "delete+insert" | "notify" | "delete+notify"
  std::string profile = "defaults";  // "defaults" | "tuned"
  int publishers = 0;                // publish and mixed: publisher processes
  int batch = 1;                     // publish: events per call; dispatch: claim max / rows per statement
  int handlers = 1;                  // relaybus: fan-out (handlers routed); floor: rows per event
  Keys keys = Keys::None;
  int dispatchers = 0;   // relaybus.workers_per_database (0 = leave the dispatchers as they are)
  int batch_size = 500;  // relaybus.batch_size
  int consumers = 1;     // consumer processes (pull, floor delete) / notify senders (floor)
  int per_key = 1;       // relay_claim per_key
  int rate = 0;          // mixed: target events per second (all publishers together)
  int concurrency =
      0;  // graphile: concurrentJobs per worker; http: the handler's concurrency (relaybus) / wrk connections (floor)
  // Dispatch: instead of a preloaded, analyzed backlog, the dispatchers idle on an
  // empty, vacuumed, never-analyzed table, then the backlog commits at once (a burst).
  bool after_idle = false;
  std::string floor;   // the floor cell this one is compared with ("" = none)
  bool quick = false;  // part of --quick
};

// HttpLog is a listener (reaped after delivery stopped, counts units, leaves receipts)
// that reads the local nginx receiver's access log instead of a connection;
// Exec runs a program (wrk) from warm-up start to the window's end; External runs a
// peer's own worker or daemon under the ready/go contract in children.cpp.
enum class Role { Publish, ClaimAck, Take, Listen, NotifySend, PgqBatch, External, HttpLog, Exec };

// What one child process does. SQL comes from the system under test, so a peer
// adds SQL and setup, not a new process type (unless its protocol differs).
struct ChildSpec {
  Role role = Role::Publish;
  std::string label;  // "pub-0", "claim-1", ... (file names)
  std::string conninfo;
  std::string dir;  // where the child writes its files
  // Publish: sql takes ($1 payload, $2 key) when batch == 1, or ($1 jsonb[] text, $2 text[] text)
  // when batch > 1; returns event ids (one bigint, or a bigint[]) when returns_ids.
  std::string sql;
  int batch = 1;
  Keys keys = Keys::None;
  double rate = 0;  // events/s of this process (0 = as fast as it can)
  bool returns_ids = false;
  bool record_pubs = false;
  uint32_t seed = 1;
  // ClaimAck: claim_sql (no parameters) returns (delivery_id, event_id, key, seq, ...);
  // ack_sql takes $1 = bigint[] text. BEGIN; claim; ack; COMMIT.
  // Take: sql (no parameters) returns (id, key, ...) and completes them itself.
  std::string claim_sql, ack_sql;
  int handler_index = 0;
  // Listen: channels[i] belongs to handler_index + i; ack_sql as above (notify ack mode).
  std::vector<std::string> channels;
  int ack_batch = 500;
  // NotifySend: sql takes $1 = text[] of payloads (batch of them) when send_payloads,
  // else sql has no parameters and returns the number of rows it handed over.
  bool send_payloads = false;
  // PgqBatch (PgQ's consumer protocol): BEGIN; batch_sql (no parameters) returns a batch id or
  // NULL; events_sql ($1 = batch id) returns (ev_id, key, ...); finish_sql ($1 = batch id); COMMIT.
  std::string batch_sql, events_sql, finish_sql;
  // External: a program run with argv and env (NAME=value) added; see children.cpp for the
  // contract. reports_units: it writes the ChildOut file and counts units (the graphile-worker
  // runner); false for a helper daemon that only runs during the sample (pgqd).
  std::vector<std::string> argv, env;
  bool reports_units = true;
  // HttpLog: the access log ("<msec> <webhook-id> <status>" per request), the nginx
  // master's pid (SIGUSR1 flushes the log buffers); map_sql (optional) returns
  // (delivery id, event id, key, seq, handler name) of the preloaded deliveries.
  std::string http_log, map_sql;
  int nginx_pid = 0;
  // Exec uses argv too (External's field): "{secs}" is replaced by the seconds left to t1.
};

// Timing the parent hands to every child (CLOCK_MONOTONIC ns).
struct Go {
  int64_t t_warm = 0, t0 = 0, t1 = 0;
};

// One delivery seen by a consumer.
struct Receipt {
  int64_t event_id;
  int64_t delivery_id;
  int64_t seq;  // -1 = NULL
  int64_t mono_ns;
  int64_t real_ns;
  int32_t key_id;  // -1 = unkeyed
  int16_t handler;
  int16_t flags;  // 1 = acked (ack mode), 2 = bad parse
};

// One published event (mixed cells), its commit time taken after COMMIT returned.
struct PubRec {
  int64_t event_id;
  int64_t mono_ns;
  int64_t real_ns;
};

// What a child reports (key=value text file).
struct ChildOut {
  std::string label;
  long long units_window = 0;    // events or deliveries completed inside [t0, t1]
  long long units_since_t0 = 0;  // completed from t0 until the child stopped
  long long units_total = 0;     // completed since start (warm-up included)
  long long errors = 0;
  std::string first_error;
  long long empty_in_window = 0;  // claims/takes that found nothing inside the window
  double call_p50_us = NAN, call_p99_us = NAN;
  long long calls_window = 0;
  bool ok = false;  // the file was there
};

std::string key_text(Keys k, uint32_t r);  // "k<N>" or "" for none
int32_t key_id_of(const char* key);        // parses "k<N>", -1 for NULL/other
std::string make_payload(uint64_t order, int64_t t_real_ns);

}  // namespace bench
