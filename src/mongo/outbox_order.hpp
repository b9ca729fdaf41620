// The order in which the sequencer takes outbox documents on FerretDB
// (docs/mongo.md, "Order"): _id order over one snapshot of the outbox.
//
// FerretDB's PostgreSQL backend returns a collection in physical order, which
// reuses freed space, and sorts only in Go over the whole collection; so the
// sequencer reads the outbox with one unsorted find (one SQL statement, one
// snapshot, across its getMores) and orders it here. A publisher's event N
// was acknowledged before its event N + 1 was inserted: a snapshot that holds
// N + 1 holds N, and with growing _ids, N sorts first.
#pragma once

#include <bson/bson.h>

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace relaybus::mongo {

// The sequencer's snapshot of the outbox on FerretDB holds at most this much
// (a deeper outbox is taken in several snapshots, each the smallest _ids).
constexpr size_t kOutboxSnapshotDocs = 100000;
constexpr size_t kOutboxSnapshotBytes = size_t{64} << 20;

// A byte string whose order is the BSON order of the document's _id
// (MongoDB's type ranks; numbers by value, strings and ObjectIds bytewise).
std::string outbox_order_key(const bson_t* doc);

// Collects a snapshot's documents, keeping only the smallest ones by key
// while more than `max_docs` or `max_bytes` arrive: what it keeps is always
// every document below a ceiling key, so a publisher's kept events have all
// their predecessors of the snapshot kept too.
class OutboxSnapshot {
 public:
  OutboxSnapshot(size_t max_docs, size_t max_bytes) : max_docs_(max_docs), max_bytes_(max_bytes) {}
  void add(const bson_t* doc);  // copies it
  // The kept documents in order (see outbox_order.cpp for driver ObjectIds
  // whose counter wrapped).
  std::vector<std::shared_ptr<bson_t>> take();
  bool truncated() const { return !ceiling_.empty(); }

 private:
  size_t max_docs_, max_bytes_, bytes_ = 0;
  std::string ceiling_;  // empty: nothing evicted
  std::multimap<std::string, std::shared_ptr<bson_t>> kept_;
};

}  // namespace relaybus::mongo
