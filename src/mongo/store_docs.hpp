// What the store's files share (not part of the Store interface): the
// collection names and the BSON pieces their commands are built of.
#pragma once

#include <mongoc/mongoc.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "mongo/store.hpp"
#include "mongo/util.hpp"

namespace relaybus::mongo {

inline constexpr const char* kDeliveries = "relay_deliveries";
inline constexpr const char* kHandlers = "relay_handlers";
inline constexpr const char* kRoutes = "relay_routes";
inline constexpr const char* kKeySeqs = "relay_key_seqs";
inline constexpr const char* kCounters = "relay_counters";
inline constexpr const char* kLanes = "relay_lanes";
inline constexpr const char* kInstances = "relay_instances";
inline constexpr const char* kDeadLetters = "relay_dead_letters";
inline constexpr const char* kSegmentsColl = "relay_segments";

// (index into the documents sent, code) of each write error in a reply
// (insertMany, bulk).
std::vector<std::pair<int, int>> write_errors(const bson_t* reply);

// name: [v...]
void append_int64_array(bson_t* parent, const char* name, const std::vector<int64_t>& v);
void append_int32_array(bson_t* parent, const char* name, const std::vector<int>& v);
// {_id: {$in: ids}}
void id_in(bson_t* filter, const std::vector<int64_t>& ids);
// {handler_dropped_at: {$exists: false}}: a dead letter of a handler that
// was not dropped (a dropped handler's dead letters stay for inspection only).
void not_dropped(bson_t* filter);

// Every document of the cursor to f, then the cursor destroyed; throws
// StoreError(what) if the cursor failed (after f saw what came before).
template <typename F>
void each_doc(mongoc_cursor_t* cur, const char* what, F&& f) {
  const bson_t* doc;
  while (mongoc_cursor_next(cur, &doc)) f(doc);
  bson_error_t err;
  bool failed = mongoc_cursor_error(cur, &err);
  mongoc_cursor_destroy(cur);
  if (failed) raise_store_error(what, err);
}

template <typename F>
void Store::each_in(const char* collection, const char* what, F&& f) {
  Bson filter;
  const auto command = count("find");
  each_doc(mongoc_collection_find_with_opts(coll(collection), filter, nullptr, nullptr), what, std::forward<F>(f));
}

// Documents a command sends, destroyed with this (also when it throws).
class OwnedDocs {
 public:
  OwnedDocs() = default;
  ~OwnedDocs() {
    for (bson_t* d : docs_) bson_destroy(d);
  }
  OwnedDocs(const OwnedDocs&) = delete;
  OwnedDocs& operator=(const OwnedDocs&) = delete;
  bson_t* add() { return docs_.emplace_back(bson_new()); }
  const std::vector<bson_t*>& get() const { return docs_; }
  bool empty() const { return docs_.empty(); }
  size_t size() const { return docs_.size(); }

 private:
  std::vector<bson_t*> docs_;
};

}  // namespace relaybus::mongo
