// Store calls of the delivery documents (store.hpp): the windows a claim
// reads, the fence, and what ends an attempt (complete, fail). A malformed
// document whose _id is not an integer cannot be addressed by these calls;
// the dispatcher leaves it alone and `stats` counts it.
#include <algorithm>
#include <map>

#include "core/lane_hash.hpp"
#include "core/text_util.hpp"
#include "core/topic.hpp"
#include "mongo/store.hpp"
#include "mongo/store_docs.hpp"
#include "mongo/util.hpp"

namespace relaybus::mongo {

namespace {

// Parses a delivery document; malformed documents keep the reason in d.malformed.
Delivery parse_delivery(const bson_t* doc) {
  Delivery d;
  std::vector<std::string> problems;
  // get_int64 writes only what it found: a missing field leaves the default.
  auto integer = [&](const char* name, int64_t* out) {
    if (!get_int64(doc, name, out)) problems.push_back(std::string(name) + " must be an integer");
  };
  int64_t x = 0;
  integer("_id", &d.id);
  integer("event_id", &d.event_id);
  if (!get_string(doc, "handler", &d.handler)) problems.push_back("handler must be a string");
  if (get_int64(doc, "lane", &x) && x >= 0 && x < core::kLanes)
    d.lane = static_cast<int>(x);
  else
    problems.push_back("lane must be an integer 0..63");
  bson_iter_t it;
  if (bson_iter_init_find(&it, doc, "key") && !BSON_ITER_HOLDS_NULL(&it)) {
    if (get_string(doc, "key", &d.key))
      d.has_key = true;
    else
      problems.push_back("key must be a string or absent");
  }
  integer("seq", &d.seq);
  if (get_int64(doc, "priority", &x) && x >= 0 && x <= 3)
    d.priority = static_cast<int>(x);
  else
    problems.push_back("priority must be an integer 0..3");
  if (bson_iter_init_find(&it, doc, "not_before") && !get_date_ms(doc, "not_before", &d.not_before_ms))
    problems.push_back("not_before must be a date");
  if (bson_iter_init_find(&it, doc, "published_at") && !get_date_ms(doc, "published_at", &d.published_ms))
    problems.push_back("published_at must be a date");
  if (bson_iter_init_find(&it, doc, "attempt")) {
    if (get_int64(doc, "attempt", &x) && x >= 0 && x < 1000000)
      d.attempt = static_cast<int>(x);
    else
      problems.push_back("attempt must be a non-negative integer");
  }
  std::string topic, wire;
  if (!get_string(doc, "topic", &topic) || !core::is_valid_topic(topic, nullptr))
    problems.push_back("topic must be a valid topic");
  if (bson_iter_init_find(&it, doc, "wire_topic") && !BSON_ITER_HOLDS_NULL(&it) &&
      !get_string(doc, "wire_topic", &wire))
    problems.push_back("wire_topic must be a string");
  d.topic = wire.empty() ? topic : wire;
  if (bson_iter_init_find(&it, doc, "payload"))
    d.payload_json = bson_value_to_json(bson_iter_value(&it));
  else
    problems.push_back("payload is missing");
  if (bson_iter_init_find(&it, doc, "headers") && !BSON_ITER_HOLDS_NULL(&it)) {
    if (BSON_ITER_HOLDS_DOCUMENT(&it))
      d.headers_json = bson_value_to_json(bson_iter_value(&it));
    else
      problems.push_back("headers must be an object or absent");
  }
  if (problems.empty() && d.has_key && d.lane != core::lane_for_key(d.key))
    problems.push_back("lane " + std::to_string(d.lane) + " is not the key's lane " +
                       std::to_string(core::lane_for_key(d.key)) + " (fnv1a64(key) mod 64)");
  if (!problems.empty()) {
    d.malformed = "malformed delivery document: ";
    for (size_t i = 0; i < problems.size(); i++) d.malformed += (i ? "; " : "") + problems[i];
  }
  return d;
}

}  // namespace

std::vector<Delivery> Store::fetch_window(const std::string& handler, const std::vector<int>& lanes, int limit) {
  return find_deliveries(handler, lanes, nullptr, limit, "fetch deliveries");
}

std::vector<Delivery> Store::fetch_class_window(const std::string& handler, const std::vector<int>& lanes, int priority,
                                                int limit) {
  return find_deliveries(handler, lanes, &priority, limit, "fetch deliveries of a priority class");
}

std::vector<Delivery> Store::find_deliveries(const std::string& handler, const std::vector<int>& lanes,
                                             const int* priority, int limit, const char* what) {
  if (lanes.empty()) return {};
  Bson filter;
  BSON_APPEND_UTF8(filter, "handler", handler.c_str());
  if (priority != nullptr) BSON_APPEND_INT32(filter, "priority", *priority);
  if (static_cast<int>(lanes.size()) < core::kLanes) {
    bson_t in;
    bson_append_document_begin(filter, "lane", 4, &in);
    append_int32_array(&in, "$in", lanes);
    bson_append_document_end(filter, &in);
  }
  // The oldest `limit` rows. MongoDB: _id order (the _id index, or the
  // dispatch index and a sort of the handler's rows in these lanes). FerretDB
  // sorts in Go whatever the filter matches, a segment's rows at most (256
  // ids); without a sort it streams rows in their physical order and stops
  // at the limit. On the SQLite backend that is insertion order, which is _id
  // order (the sequencer inserts in _id order, a retry's update stays in
  // place, replays are in relay_deliveries, read first), so no sort; on the
  // PostgreSQL backend a retry's update moves its row, and a window cut at
  // the limit would hold a key's later rows without it. The planner sorts
  // what it gets.
  return find_in_segments(filter, handler, priority, limit, !keeps_insertion_order(), what);
}

std::vector<Delivery> Store::find_in_segments(const bson_t* filter, const std::string& handler, const int* priority,
                                              int limit, bool sorted, const char* what) {
  std::vector<Delivery> out;
  std::vector<Segment> list = delivery_collections();
  bool refreshed = false;
  for (size_t i = 0;; i++) {
    if (i == list.size()) {
      // The end of the segments known: newer ones may have appeared since.
      if (refreshed) break;
      const int64_t last = list.back().first_id;
      list = delivery_collections(100);
      refreshed = true;
      for (i = 0; i < list.size() && list[i].first_id <= last; i++) {
      }
      if (i == list.size()) break;
    }
    const Segment& seg = list[i];
    if (priority != nullptr && !(seg.classes & (1u << *priority))) continue;
    if (seg.first_id >= 0 && seg.first_id > inserted_bound_) break;  // newer segments: later versions only
    // The segment the bound falls in: only its ids up to the bound.
    Bson bounded;
    const bool cut = seg.first_id >= 0 && seg.first_id + kSegmentIds - 1 > inserted_bound_;
    if (cut) {
      bson_copy_to_excluding_noinit(filter, bounded, "_id", nullptr);
      bson_t lte;
      bson_append_document_begin(bounded, "_id", 3, &lte);
      BSON_APPEND_INT64(&lte, "$lte", inserted_bound_);
      bson_append_document_end(bounded, &lte);
    }
    Bson opts;
    if (sorted) {
      bson_t sort;
      bson_append_document_begin(opts, "sort", 4, &sort);
      BSON_APPEND_INT32(&sort, "_id", 1);
      bson_append_document_end(opts, &sort);
    }
    const int want = limit > 0 ? limit - static_cast<int>(out.size()) : 0;
    if (want > 0) {
      BSON_APPEND_INT64(opts, "limit", want);
      BSON_APPEND_INT32(opts, "batchSize", want);
    }
    const auto command = count("find");
    mongoc_cursor_t* cur =
        mongoc_collection_find_with_opts(coll(seg.collection.c_str()), cut ? bounded.get() : filter, opts, nullptr);
    each_doc(cur, what, [&](const bson_t* doc) {
      Delivery d = parse_delivery(doc);
      if (d.handler.empty()) d.handler = handler;
      if (seg.first_id < 0 && d.id != 0) base_ids_.insert(d.id);
      out.push_back(std::move(d));
    });
    pause_point("after_segment_read", seg.collection);
    if (limit > 0 && static_cast<int>(out.size()) >= limit) break;
  }
  return out;
}

std::vector<std::string> Store::earlier_keys(const std::string& handler,
                                             const std::vector<std::pair<std::string, int64_t>>& key_seqs) {
  std::vector<std::string> out;
  if (key_seqs.empty()) return out;
  Bson filter, opts;
  BSON_APPEND_UTF8(filter, "handler", handler.c_str());
  bson_t orr;
  bson_append_array_begin(filter, "$or", 3, &orr);
  for (size_t i = 0; i < key_seqs.size(); i++) {
    bson_t c, lt;
    bson_append_document_begin(&orr, std::to_string(i).c_str(), -1, &c);
    BSON_APPEND_UTF8(&c, "key", key_seqs[i].first.c_str());
    bson_append_document_begin(&c, "seq", 3, &lt);
    BSON_APPEND_INT64(&lt, "$lt", key_seqs[i].second);
    bson_append_document_end(&c, &lt);
    bson_append_document_end(&orr, &c);
  }
  bson_append_array_end(filter, &orr);
  bson_t proj;
  bson_append_document_begin(opts, "projection", -1, &proj);
  BSON_APPEND_INT32(&proj, "key", 1);
  bson_append_document_end(opts, &proj);
  const std::vector<Segment> segs = delivery_collections(100);
  for (const auto& seg : segs) {
    const auto command = count("find");
    mongoc_cursor_t* cur = mongoc_collection_find_with_opts(coll(seg.collection.c_str()), filter, opts, nullptr);
    each_doc(cur, "fence read", [&](const bson_t* doc) {
      std::string key;
      if (get_string(doc, "key", &key)) out.push_back(std::move(key));
    });
  }
  return out;
}

int64_t Store::complete(const std::vector<int64_t>& ids) {
  if (ids.empty()) return 0;
  // One deleteMany {_id: {$in}} per segment (a batch spans one or two): on
  // MongoDB index lookups of these ids; FerretDB v1 evaluates every delete
  // over the whole collection, which a segment bounds (a bulk of deleteOne
  // by _id is one such scan per id, so one command is its cheapest form).
  int64_t deleted = 0;
  bool first = true;
  for (const auto& [c, part] : by_collection(ids)) {
    if (!first) crash_point("between_segment_completes");
    first = false;
    deleted += delete_deliveries(c, part);
  }
  for (int64_t id : ids) base_ids_.erase(id);
  return deleted;
}

int64_t Store::delete_deliveries(mongoc_collection_t* c, const std::vector<int64_t>& ids) {
  Bson filter, reply;
  id_in(filter, ids);
  bson_error_t err;
  const auto command = count("delete");
  if (!mongoc_collection_delete_many(c, filter, nullptr, reply, &err)) raise_store_error("complete", err);
  int64_t n = 0;
  get_int64(reply, "deletedCount", &n);
  return n;
}

void Store::fail(const std::vector<Failure>& failures, int64_t now_ms) {
  // Grouped by the segment that holds each delivery: one bulk of updates
  // per segment; per segment one find, then one insert of dead letters, and
  // one delete per segment at the end.
  std::map<int64_t, const Failure*> failure_of;
  std::vector<int64_t> retry_ids, dead_ids;
  for (const auto& f : failures) {
    failure_of[f.id] = &f;
    (f.dead ? dead_ids : retry_ids).push_back(f.id);
  }
  auto group = [&](const std::vector<int64_t>& ids) {
    std::vector<std::pair<mongoc_collection_t*, std::vector<const Failure*>>> out;
    for (auto& [c, part] : by_collection(ids)) {
      out.emplace_back(c, std::vector<const Failure*>{});
      for (int64_t id : part) out.back().second.push_back(failure_of[id]);
    }
    return out;
  };
  const auto retries_by = group(retry_ids);
  const auto deads_by = group(dead_ids);
  bson_error_t err;
  // At most kRetriesPerCommand updates per command: FerretDB v1.24's SQLite
  // backend keeps a pooled connection open for each update of a command
  // until the command ends, and one of about 100 updates (a kafka handler's
  // purged runs, all retried at once) waited for a connection forever,
  // every later command on the database behind it.
  constexpr size_t kRetriesPerCommand = 32;
  for (const auto& [c, all_retries] : retries_by)
    for (size_t from = 0; from < all_retries.size(); from += kRetriesPerCommand) {
      const std::vector<const Failure*> retries(
          all_retries.begin() + from, all_retries.begin() + std::min(all_retries.size(), from + kRetriesPerCommand));
      Bson bopts;
      BSON_APPEND_BOOL(bopts, "ordered", false);
      mongoc_bulk_operation_t* bulk = mongoc_collection_create_bulk_operation_with_opts(c, bopts);
      for (const Failure* f : retries) {
        Bson sel, upd;
        BSON_APPEND_INT64(sel, "_id", f->id);
        bson_t set, inc;
        bson_append_document_begin(upd, "$set", 4, &set);
        BSON_APPEND_DATE_TIME(&set, "not_before", f->not_before_ms);
        BSON_APPEND_UTF8(&set, "last_error", core::text::truncate_utf8(f->error, 1000).c_str());
        BSON_APPEND_INT32(&set, "last_status", f->status);
        bson_append_document_end(upd, &set);
        bson_append_document_begin(upd, "$inc", 4, &inc);
        BSON_APPEND_INT32(&inc, "attempt", 1);
        bson_append_document_end(upd, &inc);
        mongoc_bulk_operation_update_one_with_opts(bulk, sel, upd, nullptr, &err);
      }
      Bson reply;
      const auto command = count("update");
      uint32_t ok = mongoc_bulk_operation_execute(bulk, reply, &err);
      mongoc_bulk_operation_destroy(bulk);
      if (!ok) raise_store_error("record retries", err);
    }
  std::vector<int64_t> all_dead;
  for (const auto& [c, deads] : deads_by) {
    // Read the documents (one find), write them as dead letters (one insert),
    // then delete them (one delete). A crash between the insert and the
    // delete sends the delivery again; its dead letter is then a duplicate key,
    // which counts as done.
    std::vector<int64_t> ids;
    std::map<int64_t, const Failure*> by_id;
    for (const Failure* f : deads) {
      ids.push_back(f->id);
      by_id[f->id] = f;
    }
    Bson filter;
    id_in(filter, ids);
    const auto command = count("find");
    mongoc_cursor_t* cur = mongoc_collection_find_with_opts(c, filter, nullptr, nullptr);
    OwnedDocs letters;
    each_doc(cur, "read dead deliveries", [&](const bson_t* doc) {
      int64_t id;
      if (!get_int64(doc, "_id", &id) || !by_id.count(id)) return;
      const Failure* f = by_id[id];
      bson_t* dl = letters.add();
      bson_copy_to_excluding_noinit(doc, dl, "attempt", "last_error", "last_status", "not_before", nullptr);
      int64_t attempt = 0;
      get_int64(doc, "attempt", &attempt);
      BSON_APPEND_INT32(dl, "attempts", static_cast<int32_t>(attempt + 1));
      BSON_APPEND_UTF8(dl, "last_error", core::text::truncate_utf8(f->error, 1000).c_str());
      if (f->status != 0) BSON_APPEND_INT32(dl, "last_status", f->status);
      BSON_APPEND_DATE_TIME(dl, "failed_at", now_ms);
    });
    insert_idempotent(kDeadLetters, letters.get(), "insert dead letters");
    all_dead.insert(all_dead.end(), ids.begin(), ids.end());
  }
  complete(all_dead);
}

}  // namespace relaybus::mongo
