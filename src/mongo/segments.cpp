// Delivery segments (store.hpp, docs/mongo.md "Delivery segments"): which
// collection holds a delivery, the catalog of segments, and their rotation.
#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "mongo/store.hpp"
#include "mongo/store_docs.hpp"
#include "mongo/util.hpp"

namespace relaybus::mongo {

namespace {

int64_t first_id_of(int64_t id) { return id - id % kSegmentIds; }
}  // namespace

// Zero-padded, so that the names sort as the ids do.
std::string segment_collection(int64_t first_id) {
  char buf[64];
  snprintf(buf, sizeof buf, "relay_deliveries_%019" PRId64, first_id);
  return buf;
}

const std::vector<Segment>& Store::delivery_collections(int64_t max_age_ms) {
  const int64_t now = monotonic_ms();
  if (segments_read_ms_ >= 0 && now - segments_read_ms_ <= max_age_ms) return segments_;
  Bson filter, opts, sort;
  bson_append_document_begin(opts, "sort", 4, sort);
  BSON_APPEND_INT32(sort, "_id", 1);
  bson_append_document_end(opts, sort);
  const auto command = count("find");
  mongoc_cursor_t* cur = mongoc_collection_find_with_opts(coll(kSegmentsColl), filter, opts, nullptr);
  std::vector<Segment> out;
  out.push_back({-1, 0xF, kDeliveries});
  const bson_t* doc;
  while (mongoc_cursor_next(cur, &doc)) {
    int64_t first = 0;
    if (!get_int64(doc, "_id", &first) || first < 0) continue;
    Segment s;
    s.first_id = first;
    s.classes = 0;
    for (int c = 0; c < 4; c++) {
      bson_iter_t it;
      const std::string f = "c" + std::to_string(c);
      if (bson_iter_init_find(&it, doc, f.c_str()) && bson_iter_as_bool(&it)) s.classes |= 1u << c;
    }
    s.collection = segment_collection(first);
    out.push_back(std::move(s));
  }
  bson_error_t err;
  bool failed = mongoc_cursor_error(cur, &err);
  mongoc_cursor_destroy(cur);
  if (failed) raise_store_error("read delivery segments", err);
  // FerretDB lists no sort it cannot push down; keep id order regardless.
  std::sort(out.begin() + 1, out.end(), [](const Segment& a, const Segment& b) { return a.first_id < b.first_id; });
  // Forget the handles of segments that are gone.
  std::set<std::string> live;
  for (const auto& s : out) live.insert(s.collection);
  for (auto it = colls_.begin(); it != colls_.end();) {
    if (it->first.rfind("relay_deliveries_", 0) == 0 && !live.count(it->first)) {
      mongoc_collection_destroy(it->second);
      it = colls_.erase(it);
    } else {
      ++it;
    }
  }
  segments_ = std::move(out);
  segments_read_ms_ = now;
  return segments_;
}

mongoc_collection_t* Store::delivery_coll(int64_t id) {
  if (base_ids_.count(id)) return coll(kDeliveries);
  return coll(segment_collection(first_id_of(id)).c_str());
}

std::vector<std::pair<mongoc_collection_t*, std::vector<int64_t>>> Store::by_collection(
    const std::vector<int64_t>& ids) {
  // Oldest first: relay_deliveries (-1), then the segments in id order. A
  // crash between two of the commands then leaves a key's newer deliveries
  // pending, never an older one behind a newer one that was completed, which
  // the next holder would send again after it (out of key order).
  std::map<int64_t, std::vector<int64_t>> by_first;
  for (int64_t id : ids) by_first[base_ids_.count(id) ? -1 : first_id_of(id)].push_back(id);
  std::vector<std::pair<mongoc_collection_t*, std::vector<int64_t>>> out;
  for (auto& [first, part] : by_first) out.emplace_back(delivery_coll(part.front()), std::move(part));
  return out;
}

void Store::prepare_segments(const std::map<int64_t, unsigned>& classes_by_first_id) {
  for (const auto& [first, classes] : classes_by_first_id) {
    // One upsert per segment and batch: the classes only grow.
    Bson filter, upd, opts, reply;
    BSON_APPEND_INT64(filter, "_id", first);
    bson_t set;
    bson_append_document_begin(upd, "$set", 4, &set);
    for (int c = 0; c < 4; c++)
      if (classes & (1u << c)) BSON_APPEND_BOOL(&set, ("c" + std::to_string(c)).c_str(), true);
    bson_append_document_end(upd, &set);
    BSON_APPEND_BOOL(opts, "upsert", true);
    bson_error_t err;
    const auto command = count("update");
    if (!mongoc_collection_update_one(coll(kSegmentsColl), filter, upd, opts, reply, &err) && err.code != kDuplicateKey)
      raise_store_error("record a delivery segment", err);
    if (prepared_.count(first)) continue;
    // The indexes the dispatcher's reads use on MongoDB (init() gives
    // relay_deliveries the same ones).
    // One index per command: FerretDB v1.24 panics on a createIndexes of
    // two when they exist already (a second process preparing the segment).
    const std::string name = segment_collection(first);
    struct Spec {
      const char* name;
      const char* fields[3];
      bool unique;
    };
    for (const Spec& ix :
         {Spec{"dispatch", {"handler", "lane", "_id"}, false}, Spec{"key_seq", {"handler", "key", "seq"}, true}}) {
      Bson cmd, ireply;
      BSON_APPEND_UTF8(cmd, "createIndexes", name.c_str());
      bson_t arr, spec, key;
      bson_append_array_begin(cmd, "indexes", -1, &arr);
      bson_append_document_begin(&arr, "0", 1, &spec);
      bson_append_document_begin(&spec, "key", 3, &key);
      for (const char* f : ix.fields) BSON_APPEND_INT32(&key, f, 1);
      bson_append_document_end(&spec, &key);
      BSON_APPEND_UTF8(&spec, "name", ix.name);
      if (ix.unique) BSON_APPEND_BOOL(&spec, "unique", true);
      bson_append_document_end(&arr, &spec);
      bson_append_array_end(cmd, &arr);
      const auto command = count("createIndexes");
      mongoc_database_t* d = mongoc_client_get_database(client_, db_.c_str());
      bool ok = mongoc_database_write_command_with_opts(d, cmd, nullptr, ireply, &err);
      mongoc_database_destroy(d);
      if (!ok) raise_store_error("create the indexes of a delivery segment", err);
    }
    prepared_.insert(first);
  }
  segments_read_ms_ = -1;  // readers in this process see them at once
}

void Store::insert_deliveries(const std::vector<bson_t*>& docs) {
  std::map<int64_t, std::vector<bson_t*>> by_segment;
  for (bson_t* d : docs) {
    int64_t id = 0;
    get_int64(d, "_id", &id);
    by_segment[first_id_of(id)].push_back(d);
  }
  for (const auto& [first, part] : by_segment)
    insert_idempotent(segment_collection(first).c_str(), part, "insert deliveries");
}

int Store::drop_drained_segments(int64_t assigned_below) {
  int dropped = 0;
  const std::vector<Segment> segs = delivery_collections(0);
  for (const auto& s : segs) {
    if (s.first_id < 0 || s.first_id + kSegmentIds > assigned_below) continue;
    Bson filter, opts;
    BSON_APPEND_INT64(opts, "limit", 1);
    const auto command = count("find");
    mongoc_cursor_t* cur = mongoc_collection_find_with_opts(coll(s.collection.c_str()), filter, opts, nullptr);
    const bson_t* doc;
    const bool empty = !mongoc_cursor_next(cur, &doc);
    bson_error_t err;
    bool failed = mongoc_cursor_error(cur, &err);
    mongoc_cursor_destroy(cur);
    if (failed) raise_store_error("read a delivery segment", err);
    if (!empty) continue;
    // Only the sequencer inserts into a segment, and only ids it has not
    // assigned yet: an empty, fully assigned segment stays empty.
    const auto dropping = count("drop");
    if (!mongoc_collection_drop(coll(s.collection.c_str()), &err) && err.code != 26 /* NamespaceNotFound */)
      raise_store_error("drop a delivery segment", err);
    Bson f, reply;
    BSON_APPEND_INT64(f, "_id", s.first_id);
    const auto forgetting = count("delete");
    if (!mongoc_collection_delete_one(coll(kSegmentsColl), f, nullptr, reply, &err))
      raise_store_error("forget a delivery segment", err);
    prepared_.erase(s.first_id);
    dropped++;
  }
  if (dropped > 0) segments_read_ms_ = -1;
  return dropped;
}

}  // namespace relaybus::mongo
