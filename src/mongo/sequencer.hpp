// The sequencer: the only writer of event ids, key seqs, lanes and deliveries
// (docs/mongo.md, "The outbox" and "The sequencer").
//
// One instance holds the sequencer role: the lease "lane" kSequencerLane in
// relay_lanes, taken, renewed and given back like a delivery lane (insert
// epoch + 1; the unique (lane, epoch) index decides races). Its holder turns
// the outbox, in _id order (on FerretDB one snapshot of it at a time,
// outbox_order.hpp), into events in batches. A batch is one
// *version* of relay_sequence: {_id: v, epoch, owner, at, next_id, events:
// [{o: outbox _id, e: event id, k: key, s: seq, h: [{n: handler, w: wire}],
// d: dedupe key, r: rejection, f: folded into}]}. Inserting version v + 1 is the
// commit: its unique _id lets exactly one writer assign a batch after version
// v, so no id and no key seq is ever handed out twice, whoever else thinks it
// sequences. Then the version is applied, each step idempotent: key seqs
// ($max), dedupe records, rejects, deliveries (deterministic _ids: event id +
// the handler's index), and the outbox documents are removed last; older
// versions are trimmed. A holder that starts (or restarts after a crash)
// re-applies the top version first: a crash between any two steps neither
// loses nor duplicates an event.
#pragma once

#include <bson/bson.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/route_resolver.hpp"
#include "mongo/store.hpp"

namespace relaybus::mongo {

constexpr int kSequencerLane = -1;  // its lease documents in relay_lanes: {_id: "-1:<epoch>", lane: -1, ...}

class Sequencer {
 public:
  Sequencer(Store& store, std::string owner, int max_key_bytes);

  // A tenure starts at `epoch` (the lease's fencing token): the next step
  // recovers from relay_sequence first.
  void begin(int64_t epoch);
  // The role was lost or given back: forget everything.
  void end();
  bool active() const { return epoch_ > 0; }

  // One batch: up to `limit` outbox documents. `holds` says whether the role
  // still holds (lease epoch unchanged, time left); it is asked before every
  // write, and a false answer stops the batch (what was committed is redone by
  // the next holder). Returns the outbox documents consumed. Throws StoreError.
  int step(int limit, int64_t now_ms, const std::function<bool()>& holds);

  uint64_t sequenced() const { return sequenced_; }
  // Malformed traceparent/tracestate values left out of outbox documents' headers.
  uint64_t trace_context_ignored() const { return trace_context_ignored_; }

 private:
  struct Event;
  struct Version;

  bool recover(const std::function<bool()>& holds);
  void load_catalog();
  bool apply(const Version& v, const std::function<bool()>& holds);

  Store& store_;
  std::string owner_;
  int max_key_bytes_;
  int64_t epoch_ = 0;
  uint64_t trace_context_ignored_ = 0;
  bool recovered_ = false;
  int64_t version_ = 0;  // the top version, applied
  int64_t next_id_ = 1;
  std::map<std::string, int64_t> key_seqs_;  // a cache: the last seq per key, as of version_
  // The rest of the last outbox read, in order, taken `limit` at a time
  // before the outbox is read again; dropped on any failure or lost role
  // (its documents are still in the outbox, and a later read has them again).
  std::deque<std::shared_ptr<bson_t>> unread_;
  std::vector<std::string> handlers_;  // sorted; a handler's index is its key in routes_
  core::RouteResolver routes_;
  uint64_t sequenced_ = 0;
  int64_t rotated_ms_ = 0;  // the last drop_drained_segments
};

}  // namespace relaybus::mongo
