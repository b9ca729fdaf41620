// Store calls of the lane leases and the instances (store.hpp): relay_lanes
// and relay_instances. The lease rules are lane_leases.hpp's.
#include "mongo/store.hpp"
#include "mongo/store_docs.hpp"
#include "mongo/util.hpp"

namespace relaybus::mongo {

namespace {

std::string lane_id(int lane, int64_t epoch) { return std::to_string(lane) + ":" + std::to_string(epoch); }

}  // namespace

std::vector<LaneDoc> Store::read_lanes() {
  std::vector<LaneDoc> out;
  each_in(kLanes, "read lanes", [&](const bson_t* doc) {
    LaneDoc l;
    int64_t x;
    if (!get_int64(doc, "lane", &x)) return;
    l.lane = static_cast<int>(x);
    if (!get_int64(doc, "epoch", &l.epoch)) return;
    get_string(doc, "owner", &l.owner);
    get_date_ms(doc, "until", &l.until_ms);
    out.push_back(std::move(l));
  });
  return out;
}

std::vector<bool> Store::insert_lanes(const std::vector<LaneDoc>& ls) {
  std::vector<bool> inserted(ls.size(), true);
  if (ls.empty()) return inserted;
  std::vector<bson_t*> docs;
  for (const auto& l : ls) {
    bson_t* d = bson_new();
    BSON_APPEND_UTF8(d, "_id", lane_id(l.lane, l.epoch).c_str());
    BSON_APPEND_INT32(d, "lane", l.lane);
    BSON_APPEND_INT64(d, "epoch", l.epoch);
    BSON_APPEND_UTF8(d, "owner", l.owner.c_str());
    BSON_APPEND_DATE_TIME(d, "until", l.until_ms);
    docs.push_back(d);
  }
  Bson opts, reply;
  BSON_APPEND_BOOL(opts, "ordered", false);
  bson_error_t err;
  const auto command = count("insert", true);
  bool ok = mongoc_collection_insert_many(coll(kLanes), const_cast<const bson_t**>(docs.data()), docs.size(), opts,
                                          reply, &err);
  for (bson_t* d : docs) bson_destroy(d);
  if (ok) return inserted;
  auto errs = write_errors(reply);
  if (errs.empty()) raise_store_error("insert lane leases", err);
  for (const auto& [index, code] : errs) {
    if (code != kDuplicateKey) raise_store_error("insert lane leases", err);
    if (index >= 0 && index < static_cast<int>(inserted.size())) inserted[index] = false;
  }
  return inserted;
}

void Store::delete_lane_docs(const std::vector<std::pair<int, int64_t>>& lane_epochs) {
  if (lane_epochs.empty()) return;
  Bson filter, reply;
  bson_t in, arr;
  bson_append_document_begin(filter, "_id", 3, &in);
  bson_append_array_begin(&in, "$in", 3, &arr);
  for (size_t i = 0; i < lane_epochs.size(); i++)
    BSON_APPEND_UTF8(&arr, std::to_string(i).c_str(), lane_id(lane_epochs[i].first, lane_epochs[i].second).c_str());
  bson_append_array_end(&in, &arr);
  bson_append_document_end(filter, &in);
  bson_error_t err;
  const auto command = count("delete");
  if (!mongoc_collection_delete_many(coll(kLanes), filter, nullptr, reply, &err))
    raise_store_error("delete old leases", err);
}

void Store::heartbeat_load(const std::string& instance, int64_t until_ms,
                           const std::map<std::string, HandlerLoad>& load) {
  Bson filter, doc, opts, reply;
  BSON_APPEND_UTF8(filter, "_id", instance.c_str());
  BSON_APPEND_UTF8(doc, "_id", instance.c_str());
  BSON_APPEND_DATE_TIME(doc, "until", until_ms);
  bson_t handlers;
  bson_append_document_begin(doc, "load", -1, &handlers);
  for (const auto& [name, l] : load) {
    bson_t h;
    bson_append_document_begin(&handlers, name.c_str(), -1, &h);
    BSON_APPEND_INT64(&h, "in_flight", l.in_flight);
    append_int64_array(&h, "latency_buckets", l.latency_buckets);
    BSON_APPEND_INT64(&h, "latency_count", l.latency_count);
    BSON_APPEND_DOUBLE(&h, "latency_sum_s", l.latency_sum_s);
    BSON_APPEND_INT64(&h, "held_back", l.held_back);
    BSON_APPEND_BOOL(&h, "limited", l.limited);
    bson_append_document_end(&handlers, &h);
  }
  bson_append_document_end(doc, &handlers);
  BSON_APPEND_BOOL(opts, "upsert", true);
  bson_error_t err;
  const auto command = count("replace");
  if (!mongoc_collection_replace_one(coll(kInstances), filter, doc, opts, reply, &err)) {
    if (err.code == kDuplicateKey) return;  // a concurrent first upsert of our own doc: harmless
    raise_store_error("heartbeat", err);
  }
}

void Store::remove_instance(const std::string& instance) { delete_id(kInstances, instance, "remove instance"); }

int Store::live_instances(int64_t now_ms) {
  int rank = 0;
  return live_instances(now_ms, "", &rank);
}

int Store::live_instances(int64_t now_ms, const std::string& instance, int* rank) {
  int n = 0;
  *rank = 0;
  each_in(kInstances, "read instances", [&](const bson_t* doc) {
    int64_t until = 0;
    if (!get_date_ms(doc, "until", &until) || until <= now_ms) return;
    n++;
    std::string id;
    if (get_string(doc, "_id", &id) && id < instance) ++*rank;
  });
  return n;
}

std::map<std::string, Store::HandlerLoad> Store::live_load(int64_t now_ms) {
  std::map<std::string, HandlerLoad> out;
  each_in(kInstances, "read instances", [&](const bson_t* doc) {
    int64_t until = 0;
    if (!get_date_ms(doc, "until", &until) || until <= now_ms) return;
    each_embedded(doc, "load", BSON_TYPE_DOCUMENT, [&](const char* handler, const bson_t* h) {
      HandlerLoad& l = out[handler];
      int64_t x = 0;
      if (get_int64(h, "in_flight", &x)) l.in_flight += x;
      if (get_int64(h, "latency_count", &x)) l.latency_count += x;
      if (get_int64(h, "held_back", &x)) l.held_back += x;
      bson_iter_t f, arr;
      if (bson_iter_init_find(&f, h, "limited") && BSON_ITER_HOLDS_BOOL(&f) && bson_iter_bool(&f)) l.limited = true;
      if (bson_iter_init_find(&f, h, "latency_sum_s") && BSON_ITER_HOLDS_DOUBLE(&f))
        l.latency_sum_s += bson_iter_double(&f);
      if (bson_iter_init_find(&f, h, "latency_buckets") && BSON_ITER_HOLDS_ARRAY(&f) && bson_iter_recurse(&f, &arr)) {
        for (size_t i = 0; bson_iter_next(&arr); i++) {
          if (l.latency_buckets.size() <= i) l.latency_buckets.resize(i + 1, 0);
          l.latency_buckets[i] += bson_iter_as_int64(&arr);
        }
      }
    });
  });
  return out;
}

}  // namespace relaybus::mongo
