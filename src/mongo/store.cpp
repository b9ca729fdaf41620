#include "mongo/store.hpp"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <random>
#include <set>

#include "core/lane_hash.hpp"
#include "core/text_util.hpp"
#include "core/topic.hpp"
#include "mongo/command_trace.hpp"
#include "mongo/outbox.hpp"
#include "mongo/util.hpp"

namespace relaybus::mongo {

void raise_store_error(const char* what, const bson_error_t& err) {
  throw StoreError(std::string(what) + ": " + err.message, static_cast<int>(err.code));
}

namespace {

constexpr const char* kDeliveries = "relay_deliveries";
constexpr const char* kHandlers = "relay_handlers";
constexpr const char* kRoutes = "relay_routes";
constexpr const char* kKeySeqs = "relay_key_seqs";
constexpr const char* kCounters = "relay_counters";
constexpr const char* kLanes = "relay_lanes";
constexpr const char* kInstances = "relay_instances";
constexpr const char* kDeadLetters = "relay_dead_letters";
constexpr const char* kSegmentsColl = "relay_segments";

// Indexes (into the inserted array) of write errors, with their codes.
std::vector<std::pair<int, int>> write_errors(const bson_t* reply) {
  std::vector<std::pair<int, int>> out;
  bson_iter_t it, arr;
  if (!bson_iter_init_find(&it, reply, "writeErrors") || !BSON_ITER_HOLDS_ARRAY(&it)) return out;
  if (!bson_iter_recurse(&it, &arr)) return out;
  while (bson_iter_next(&arr)) {
    bson_iter_t e;
    if (!BSON_ITER_HOLDS_DOCUMENT(&arr) || !bson_iter_recurse(&arr, &e)) continue;
    int index = -1, code = 0;
    while (bson_iter_next(&e)) {
      if (strcmp(bson_iter_key(&e), "index") == 0) index = static_cast<int>(bson_iter_as_int64(&e));
      if (strcmp(bson_iter_key(&e), "code") == 0) code = static_cast<int>(bson_iter_as_int64(&e));
    }
    out.emplace_back(index, code);
  }
  return out;
}

// A BSON array of v's elements under name; add appends one element at a key.
template <typename T, typename Add>
void append_array(bson_t* parent, const char* name, const std::vector<T>& v, Add add) {
  bson_t arr;
  bson_append_array_begin(parent, name, -1, &arr);
  char keybuf[16];
  for (size_t i = 0; i < v.size(); i++) {
    const char* k;
    bson_uint32_to_string(static_cast<uint32_t>(i), &k, keybuf, sizeof keybuf);
    add(&arr, k, v[i]);
  }
  bson_append_array_end(parent, &arr);
}

void append_int64_array(bson_t* parent, const char* name, const std::vector<int64_t>& v) {
  append_array(parent, name, v, [](bson_t* a, const char* k, int64_t x) { bson_append_int64(a, k, -1, x); });
}

void append_int32_array(bson_t* parent, const char* name, const std::vector<int>& v) {
  append_array(parent, name, v, [](bson_t* a, const char* k, int x) { bson_append_int32(a, k, -1, x); });
}

// {_id: {$in: ids}}
void id_in(bson_t* filter, const std::vector<int64_t>& ids) {
  bson_t in;
  bson_append_document_begin(filter, "_id", 3, &in);
  append_int64_array(&in, "$in", ids);
  bson_append_document_end(filter, &in);
}

std::string lane_id(int lane, int64_t epoch) { return std::to_string(lane) + ":" + std::to_string(epoch); }

// Parses a delivery document; malformed documents keep the reason in d.malformed.
Delivery parse_delivery(const bson_t* doc) {
  Delivery d;
  std::vector<std::string> problems;
  int64_t x = 0;
  if (get_int64(doc, "_id", &x))
    d.id = x;
  else
    problems.push_back("_id must be an integer");
  if (get_int64(doc, "event_id", &x))
    d.event_id = x;
  else
    problems.push_back("event_id must be an integer");
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
  if (get_int64(doc, "seq", &x))
    d.seq = x;
  else
    problems.push_back("seq must be an integer");
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

namespace {
// libmongoc's own log lines become structured log lines. FerretDB v1 has no
// sessions, so the driver's "endSessions" warning at exit is noise: debug.
void mongoc_log(mongoc_log_level_t level, const char* domain, const char* message, void*) {
  if (level > MONGOC_LOG_LEVEL_INFO) return;
  LogLevel l = level <= MONGOC_LOG_LEVEL_CRITICAL  ? LogLevel::Error
               : level == MONGOC_LOG_LEVEL_WARNING ? LogLevel::Warn
                                                   : LogLevel::Info;
  if (strstr(message, "endSessions") != nullptr) l = LogLevel::Debug;
  log(l, "libmongoc", {{"domain", domain}, {"message", message}});
}
}  // namespace

void mongo_global_init() {
  static std::once_flag once;
  std::call_once(once, [] {
    mongoc_log_set_handler(mongoc_log, nullptr);
    mongoc_init();
    atexit(mongoc_cleanup);
  });
}

Store::Store(const std::string& uri, const std::string& database) : db_(database) {
  mongo_global_init();
  bson_error_t err;
  mongoc_uri_t* u = mongoc_uri_new_with_error(uri.c_str(), &err);
  if (u == nullptr) throw StoreError(std::string("bad MongoDB URI: ") + err.message, 0);
  // FerretDB v1 has no retryable writes (no transactions); on a replica set a
  // retried write is fine because every write of the sidecar is idempotent or
  // guarded by a unique index. Let the URI decide; default off for v1.
  if (!mongoc_uri_has_option(u, MONGOC_URI_RETRYWRITES))
    mongoc_uri_set_option_as_bool(u, MONGOC_URI_RETRYWRITES, false);
  client_ = mongoc_client_new_from_uri(u);
  mongoc_uri_destroy(u);
  if (client_ == nullptr) throw StoreError("cannot create a MongoDB client for " + uri, 0);
  mongoc_client_set_error_api(client_, MONGOC_ERROR_API_VERSION_2);
  mongoc_client_set_appname(client_, "relaybus-mongo");
  install_command_trace(client_);
}

Store::~Store() {
  for (auto& [_, c] : colls_) mongoc_collection_destroy(c);
  if (client_ != nullptr) mongoc_client_destroy(client_);
}

mongoc_collection_t* Store::coll(const char* name) {
  auto it = colls_.find(name);
  if (it != colls_.end()) return it->second;
  mongoc_collection_t* c = mongoc_client_get_collection(client_, db_.c_str(), name);
  colls_[name] = c;
  return c;
}

void Store::ping() {
  Bson cmd, reply;
  BSON_APPEND_INT32(cmd, "ping", 1);
  bson_error_t err;
  const auto command = count("ping");
  if (!mongoc_client_command_simple(client_, "admin", cmd, nullptr, reply, &err)) raise_store_error("ping", err);
}

std::vector<std::string> Store::init() {
  std::vector<std::string> created;
  mongoc_database_t* db = mongoc_client_get_database(client_, db_.c_str());
  for (const char* name : {kHandlers, kRoutes, kDeliveries, kKeySeqs, kCounters, kLanes, kInstances, kDeadLetters,
                           kOutbox, kSequence, kDedupe, kOutboxRejects, kSegmentsColl}) {
    bson_error_t err;
    const auto command = count("create");
    mongoc_collection_t* c = mongoc_database_create_collection(db, name, nullptr, &err);
    if (c != nullptr) {
      created.push_back(name);
      mongoc_collection_destroy(c);
    } else if (err.code != 48 /* NamespaceExists */) {
      mongoc_database_destroy(db);
      raise_store_error((std::string("create collection ") + name).c_str(), err);
    }
  }
  mongoc_database_destroy(db);
  struct Index {
    const char* coll;
    const char* name;
    std::vector<std::pair<const char*, int>> keys;
    bool unique;
  };
  const std::vector<Index> indexes = {
      // The dispatcher's window: a handler's deliveries in its leased lanes, oldest first.
      {kDeliveries, "dispatch", {{"handler", 1}, {"lane", 1}, {"_id", 1}}, false},
      // Per-key order: one delivery per (handler, key, seq); finds a key's head.
      {kDeliveries, "key_seq", {{"handler", 1}, {"key", 1}, {"seq", 1}}, true},
      // Lane leases: one document per (lane, epoch); the lease race rests on it.
      {kLanes, "lane_epoch", {{"lane", 1}, {"epoch", 1}}, true},
      {kRoutes, "pattern_handler", {{"pattern", 1}, {"handler", 1}}, true},
      {kDeadLetters, "handler_id", {{"handler", 1}, {"_id", 1}}, false},
  };
  for (const auto& ix : indexes) {
    Bson cmd, reply;
    BSON_APPEND_UTF8(cmd, "createIndexes", ix.coll);
    bson_t arr, spec, key;
    bson_append_array_begin(cmd, "indexes", -1, &arr);
    bson_append_document_begin(&arr, "0", 1, &spec);
    bson_append_document_begin(&spec, "key", 3, &key);
    for (const auto& [f, dir] : ix.keys) bson_append_int32(&key, f, -1, dir);
    bson_append_document_end(&spec, &key);
    BSON_APPEND_UTF8(&spec, "name", ix.name);
    if (ix.unique) BSON_APPEND_BOOL(&spec, "unique", true);
    bson_append_document_end(&arr, &spec);
    bson_append_array_end(cmd, &arr);
    bson_error_t err;
    const auto command = count("createIndexes");
    mongoc_database_t* d = mongoc_client_get_database(client_, db_.c_str());
    bool ok = mongoc_database_write_command_with_opts(d, cmd, nullptr, reply, &err);
    mongoc_database_destroy(d);
    if (!ok) raise_store_error((std::string("create index ") + ix.coll + "." + ix.name).c_str(), err);
    int64_t before = 0, after = 0;
    if (get_int64(reply, "numIndexesBefore", &before) && get_int64(reply, "numIndexesAfter", &after) && after > before)
      created.push_back(std::string(ix.coll) + "." + ix.name);
  }
  return created;
}

// ------------------------------------------------------------------ catalog

void Store::put_handler(const HandlerDoc& h) {
  Bson filter, doc, opts, reply;
  BSON_APPEND_UTF8(filter, "_id", h.name.c_str());
  BSON_APPEND_UTF8(doc, "_id", h.name.c_str());
  BSON_APPEND_UTF8(doc, "kind", core::handler_kind_name(h.kind));
  BSON_APPEND_UTF8(doc, "target", h.target.c_str());
  BSON_APPEND_UTF8(doc, "options", h.options_json.c_str());
  BSON_APPEND_BOOL(opts, "upsert", true);
  bson_error_t err;
  const auto command = count("replace");
  if (!mongoc_collection_replace_one(coll(kHandlers), filter, doc, opts, reply, &err))
    raise_store_error("store handler", err);
}

bool Store::drop_handler(const std::string& name) {
  Bson filter, reply;
  BSON_APPEND_UTF8(filter, "_id", name.c_str());
  bson_error_t err;
  const auto command = count("delete");
  if (!mongoc_collection_delete_one(coll(kHandlers), filter, nullptr, reply, &err))
    raise_store_error("drop handler", err);
  int64_t n = 0;
  get_int64(reply, "deletedCount", &n);
  Bson rf, rr;
  BSON_APPEND_UTF8(rf, "handler", name.c_str());
  const auto second_command = count("delete");
  if (!mongoc_collection_delete_many(coll(kRoutes), rf, nullptr, rr, &err)) raise_store_error("drop routes", err);
  return n > 0;
}

std::vector<HandlerDoc> Store::load_handlers(std::vector<std::string>* bad) {
  std::vector<HandlerDoc> out;
  Bson filter;
  const auto command = count("find");
  mongoc_cursor_t* cur = mongoc_collection_find_with_opts(coll(kHandlers), filter, nullptr, nullptr);
  const bson_t* doc;
  while (mongoc_cursor_next(cur, &doc)) {
    HandlerDoc h;
    std::string kind, why;
    if (!get_string(doc, "_id", &h.name) || !get_string(doc, "kind", &kind) || !get_string(doc, "target", &h.target)) {
      if (bad) bad->push_back(h.name + ": _id, kind and target must be strings");
      continue;
    }
    get_string(doc, "options", &h.options_json);
    if (!core::parse_handler_kind(kind, &h.kind, &why) || !core::validate_target(h.kind, h.target, false, &why) ||
        !core::parse_handler_options(h.kind, h.options_json, &h.options, &why)) {
      if (bad) bad->push_back(h.name + ": " + why);
      continue;
    }
    // webhook-id = this prefix + the delivery id (docs/mongo.md): never equal to
    // a PostgreSQL database's ("msg_<system id>_<oid>_"), the same on every retry.
    h.options.message_id_prefix = "msg_mongo_" + db_ + "_";
    out.push_back(std::move(h));
  }
  bson_error_t err;
  bool failed = mongoc_cursor_error(cur, &err);
  mongoc_cursor_destroy(cur);
  if (failed) raise_store_error("read handlers", err);
  return out;
}

void Store::put_route(const RouteDoc& r) {
  Bson filter, doc, opts, reply;
  std::string id = r.handler + "|" + r.pattern;
  BSON_APPEND_UTF8(filter, "_id", id.c_str());
  BSON_APPEND_UTF8(doc, "_id", id.c_str());
  BSON_APPEND_UTF8(doc, "pattern", r.pattern.c_str());
  BSON_APPEND_UTF8(doc, "handler", r.handler.c_str());
  if (!r.wire_name.empty()) BSON_APPEND_UTF8(doc, "wire_name", r.wire_name.c_str());
  BSON_APPEND_BOOL(opts, "upsert", true);
  bson_error_t err;
  const auto command = count("replace");
  if (!mongoc_collection_replace_one(coll(kRoutes), filter, doc, opts, reply, &err))
    raise_store_error("store route", err);
}

bool Store::drop_route(const std::string& pattern, const std::string& handler) {
  Bson filter, reply;
  BSON_APPEND_UTF8(filter, "_id", (handler + "|" + pattern).c_str());
  bson_error_t err;
  const auto command = count("delete");
  if (!mongoc_collection_delete_one(coll(kRoutes), filter, nullptr, reply, &err)) raise_store_error("drop route", err);
  int64_t n = 0;
  get_int64(reply, "deletedCount", &n);
  return n > 0;
}

std::vector<RouteDoc> Store::load_routes() {
  std::vector<RouteDoc> out;
  Bson filter;
  const auto command = count("find");
  mongoc_cursor_t* cur = mongoc_collection_find_with_opts(coll(kRoutes), filter, nullptr, nullptr);
  const bson_t* doc;
  while (mongoc_cursor_next(cur, &doc)) {
    RouteDoc r;
    if (!get_string(doc, "pattern", &r.pattern) || !get_string(doc, "handler", &r.handler)) continue;
    get_string(doc, "wire_name", &r.wire_name);
    out.push_back(std::move(r));
  }
  bson_error_t err;
  bool failed = mongoc_cursor_error(cur, &err);
  mongoc_cursor_destroy(cur);
  if (failed) raise_store_error("read routes", err);
  return out;
}

// ------------------------------------------------------------------ lanes

std::vector<LaneDoc> Store::read_lanes() {
  std::vector<LaneDoc> out;
  Bson filter;
  const auto command = count("find");
  mongoc_cursor_t* cur = mongoc_collection_find_with_opts(coll(kLanes), filter, nullptr, nullptr);
  const bson_t* doc;
  while (mongoc_cursor_next(cur, &doc)) {
    LaneDoc l;
    int64_t x;
    if (!get_int64(doc, "lane", &x)) continue;
    l.lane = static_cast<int>(x);
    if (!get_int64(doc, "epoch", &l.epoch)) continue;
    get_string(doc, "owner", &l.owner);
    get_date_ms(doc, "until", &l.until_ms);
    out.push_back(std::move(l));
  }
  bson_error_t err;
  bool failed = mongoc_cursor_error(cur, &err);
  mongoc_cursor_destroy(cur);
  if (failed) raise_store_error("read lanes", err);
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

void Store::heartbeat(const std::string& instance, int64_t until_ms) {
  Bson filter, doc, opts, reply;
  BSON_APPEND_UTF8(filter, "_id", instance.c_str());
  BSON_APPEND_UTF8(doc, "_id", instance.c_str());
  BSON_APPEND_DATE_TIME(doc, "until", until_ms);
  BSON_APPEND_BOOL(opts, "upsert", true);
  bson_error_t err;
  const auto command = count("replace");
  if (!mongoc_collection_replace_one(coll(kInstances), filter, doc, opts, reply, &err)) {
    if (err.code == kDuplicateKey) return;  // a concurrent first upsert of our own doc: harmless
    raise_store_error("heartbeat", err);
  }
}

void Store::remove_instance(const std::string& instance) {
  Bson filter, reply;
  BSON_APPEND_UTF8(filter, "_id", instance.c_str());
  bson_error_t err;
  const auto command = count("delete");
  if (!mongoc_collection_delete_one(coll(kInstances), filter, nullptr, reply, &err))
    raise_store_error("remove instance", err);
}

int Store::live_instances(int64_t now_ms) {
  Bson filter;
  const auto command = count("find");
  mongoc_cursor_t* cur = mongoc_collection_find_with_opts(coll(kInstances), filter, nullptr, nullptr);
  const bson_t* doc;
  int n = 0;
  while (mongoc_cursor_next(cur, &doc)) {
    int64_t until = 0;
    if (get_date_ms(doc, "until", &until) && until > now_ms) n++;
  }
  bson_error_t err;
  bool failed = mongoc_cursor_error(cur, &err);
  mongoc_cursor_destroy(cur);
  if (failed) raise_store_error("read instances", err);
  return n;
}

// ------------------------------------------------------------------ dispatch

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
  // sorts the whole collection in Go (81 % of 0.1.0's time at 1,000 pending);
  // without a sort it streams rows in insertion order and stops at the limit.
  // The sequencer inserts deliveries in _id order, so that order is _id order;
  // retries stay in place, replays are in relay_deliveries, read first. The
  // planner sorts what it gets.
  return find_in_segments(filter, handler, priority, limit, !is_ferretdb(), what);
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
    const bson_t* doc;
    while (mongoc_cursor_next(cur, &doc)) {
      Delivery d = parse_delivery(doc);
      if (d.handler.empty()) d.handler = handler;
      if (seg.first_id < 0 && d.id != 0) base_ids_.insert(d.id);
      out.push_back(std::move(d));
    }
    bson_error_t err;
    bool failed = mongoc_cursor_error(cur, &err);
    mongoc_cursor_destroy(cur);
    if (failed) raise_store_error(what, err);
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
    const bson_t* doc;
    while (mongoc_cursor_next(cur, &doc)) {
      std::string key;
      if (get_string(doc, "key", &key)) out.push_back(std::move(key));
    }
    bson_error_t err;
    bool failed = mongoc_cursor_error(cur, &err);
    mongoc_cursor_destroy(cur);
    if (failed) raise_store_error("fence read", err);
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
  for (const auto& [c, retries] : retries_by) {
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
    const bson_t* doc;
    std::vector<bson_t*> letters;
    while (mongoc_cursor_next(cur, &doc)) {
      int64_t id;
      if (!get_int64(doc, "_id", &id) || !by_id.count(id)) continue;
      const Failure* f = by_id[id];
      bson_t* dl = bson_new();
      bson_copy_to_excluding_noinit(doc, dl, "attempt", "last_error", "last_status", "not_before", nullptr);
      int64_t attempt = 0;
      get_int64(doc, "attempt", &attempt);
      BSON_APPEND_INT32(dl, "attempts", static_cast<int32_t>(attempt + 1));
      BSON_APPEND_UTF8(dl, "last_error", core::text::truncate_utf8(f->error, 1000).c_str());
      if (f->status != 0) BSON_APPEND_INT32(dl, "last_status", f->status);
      BSON_APPEND_DATE_TIME(dl, "failed_at", now_ms);
      letters.push_back(dl);
    }
    bool failed = mongoc_cursor_error(cur, &err);
    mongoc_cursor_destroy(cur);
    if (failed) {
      for (bson_t* d : letters) bson_destroy(d);
      raise_store_error("read dead deliveries", err);
    }
    if (!letters.empty()) {
      Bson opts, reply;
      BSON_APPEND_BOOL(opts, "ordered", false);
      const auto command = count("insert");
      bool ok = mongoc_collection_insert_many(coll(kDeadLetters), const_cast<const bson_t**>(letters.data()),
                                              letters.size(), opts, reply, &err);
      for (bson_t* d : letters) bson_destroy(d);
      if (!ok) {
        for (const auto& [index, code] : write_errors(reply))
          if (code != kDuplicateKey) raise_store_error("insert dead letters", err);
        if (write_errors(reply).empty()) raise_store_error("insert dead letters", err);
      }
    }
    all_dead.insert(all_dead.end(), ids.begin(), ids.end());
  }
  complete(all_dead);
}

// A malformed document whose _id is not an integer cannot be addressed by the
// calls above; the dispatcher leaves it alone and `stats` counts it.

// ------------------------------------------------------------------ operations

int64_t Store::replay(const std::string& handler, const std::vector<int64_t>& ids, int64_t now_ms) {
  Bson filter;
  if (!handler.empty()) BSON_APPEND_UTF8(filter, "handler", handler.c_str());
  if (!ids.empty()) id_in(filter, ids);
  {  // a dropped handler's dead letters stay for inspection only
    bson_t ex;
    bson_append_document_begin(filter, "handler_dropped_at", -1, &ex);
    BSON_APPEND_BOOL(&ex, "$exists", false);
    bson_append_document_end(filter, &ex);
  }
  const auto command = count("find");
  mongoc_cursor_t* cur = mongoc_collection_find_with_opts(coll(kDeadLetters), filter, nullptr, nullptr);
  const bson_t* doc;
  std::vector<bson_t*> docs;
  std::vector<int64_t> moved;
  while (mongoc_cursor_next(cur, &doc)) {
    int64_t id;
    if (!get_int64(doc, "_id", &id)) continue;
    bson_t* d = bson_new();
    bson_copy_to_excluding_noinit(doc, d, "attempts", "last_error", "last_status", "failed_at", nullptr);
    BSON_APPEND_INT32(d, "attempt", 0);
    BSON_APPEND_DATE_TIME(d, "not_before", now_ms);
    docs.push_back(d);
    moved.push_back(id);
  }
  bson_error_t err;
  bool failed = mongoc_cursor_error(cur, &err);
  mongoc_cursor_destroy(cur);
  if (failed || docs.empty()) {
    for (bson_t* d : docs) bson_destroy(d);
    if (failed) raise_store_error("read dead letters", err);
    return 0;
  }
  Bson opts, reply;
  BSON_APPEND_BOOL(opts, "ordered", false);
  const auto inserting = count("insert");
  bool ok = mongoc_collection_insert_many(coll(kDeliveries), const_cast<const bson_t**>(docs.data()), docs.size(), opts,
                                          reply, &err);
  for (bson_t* d : docs) bson_destroy(d);
  if (!ok) {
    auto errs = write_errors(reply);
    if (errs.empty()) raise_store_error("replay", err);
    for (const auto& [index, code] : errs)
      if (code != kDuplicateKey) raise_store_error("replay", err);  // duplicates: replayed already
  }
  Bson df, dr;
  id_in(df, moved);
  const auto deleting = count("delete");
  if (!mongoc_collection_delete_many(coll(kDeadLetters), df, nullptr, dr, &err)) raise_store_error("replay", err);
  return static_cast<int64_t>(moved.size());
}

std::vector<HandlerStats> Store::stats() {
  std::vector<HandlerStats> out;
  for (const auto& h : load_handlers(nullptr)) {
    HandlerStats s;
    s.handler = h.name;
    bson_error_t err;
    {
      Bson f;
      BSON_APPEND_UTF8(f, "handler", h.name.c_str());
      s.pending = count_deliveries_where(f);
      Bson fd;  // a dropped handler's dead letters are not the recreated one's
      BSON_APPEND_UTF8(fd, "handler", h.name.c_str());
      bson_t ex;
      bson_append_document_begin(fd, "handler_dropped_at", -1, &ex);
      BSON_APPEND_BOOL(&ex, "$exists", false);
      bson_append_document_end(fd, &ex);
      const auto command = count("count");
      s.dead = mongoc_collection_count_documents(coll(kDeadLetters), fd, nullptr, nullptr, nullptr, &err);
      if (s.dead < 0) raise_store_error("count", err);
    }
    {
      Bson f;
      BSON_APPEND_UTF8(f, "handler", h.name.c_str());
      bson_t gt;
      bson_append_document_begin(f, "attempt", -1, &gt);
      BSON_APPEND_INT32(&gt, "$gt", 0);
      bson_append_document_end(f, &gt);
      s.retrying = count_deliveries_where(f);
    }
    if (s.pending > 0) s.oldest_ms = oldest_published_ms(h.name);
    out.push_back(s);
  }
  return out;
}

int64_t Store::count_deliveries_where(const bson_t* filter) {
  int64_t total = 0;
  const std::vector<Segment> segs = delivery_collections(0);
  for (const auto& seg : segs) {
    bson_error_t err;
    const auto command = count("count");
    int64_t n =
        mongoc_collection_count_documents(coll(seg.collection.c_str()), filter, nullptr, nullptr, nullptr, &err);
    if (n < 0) raise_store_error("count", err);
    total += n;
  }
  return total;
}

int64_t Store::oldest_published_ms(const std::string& handler) {
  // relay_deliveries (replays) and then the oldest segment with a row.
  int64_t oldest = 0;
  const std::vector<Segment> segs = delivery_collections(0);
  for (const auto& seg : segs) {
    Bson f, opts;
    BSON_APPEND_UTF8(f, "handler", handler.c_str());
    bson_t sort;
    bson_append_document_begin(opts, "sort", 4, &sort);
    BSON_APPEND_INT32(&sort, "_id", 1);
    bson_append_document_end(opts, &sort);
    BSON_APPEND_INT64(opts, "limit", 1);
    const auto command = count("find");
    mongoc_cursor_t* cur = mongoc_collection_find_with_opts(coll(seg.collection.c_str()), f, opts, nullptr);
    const bson_t* doc;
    int64_t at = 0;
    bool found = mongoc_cursor_next(cur, &doc) && get_date_ms(doc, "published_at", &at);
    bson_error_t err;
    bool failed = mongoc_cursor_error(cur, &err);
    mongoc_cursor_destroy(cur);
    if (failed) raise_store_error("oldest pending", err);
    if (found && (oldest == 0 || at < oldest)) oldest = at;
    if (found && seg.first_id >= 0) break;
  }
  return oldest;
}

int64_t Store::count_deliveries() {
  Bson all;
  return count_deliveries_where(all);
}

// Every document of `collection` (one count command).
int64_t Store::count_all(const char* collection, const char* what) {
  Bson f;
  bson_error_t err;
  const auto command = count("count");
  int64_t n = mongoc_collection_count_documents(coll(collection), f, nullptr, nullptr, nullptr, &err);
  if (n < 0) raise_store_error(what, err);
  return n;
}

}  // namespace relaybus::mongo

// ------------------------------------------------------------------ handler administration

namespace relaybus::mongo {

bool Store::insert_handler(const HandlerDoc& h) {
  Bson doc, reply;
  BSON_APPEND_UTF8(doc, "_id", h.name.c_str());
  BSON_APPEND_UTF8(doc, "kind", core::handler_kind_name(h.kind));
  BSON_APPEND_UTF8(doc, "target", h.target.c_str());
  BSON_APPEND_UTF8(doc, "options", h.options_json.c_str());
  bson_error_t err;
  const auto command = count("insert");
  if (mongoc_collection_insert_one(coll(kHandlers), doc, nullptr, reply, &err)) return true;
  if (err.code == kDuplicateKey) return false;
  for (const auto& [index, code] : write_errors(reply))
    if (code == kDuplicateKey) return false;
  raise_store_error("create handler", err);
}

int64_t Store::count_pending(const std::string& handler) {
  Bson f;
  BSON_APPEND_UTF8(f, "handler", handler.c_str());
  return count_deliveries_where(f);
}

int64_t Store::dead_letter_handler(const std::string& handler, const std::string& reason, int64_t now_ms) {
  int64_t moved = 0;
  bson_error_t err;
  const std::vector<Segment> segs = delivery_collections(0);
  for (const auto& seg : segs)
    for (mongoc_collection_t* c = coll(seg.collection.c_str());;) {
      Bson filter, opts;
      BSON_APPEND_UTF8(filter, "handler", handler.c_str());
      BSON_APPEND_INT64(opts, "limit", 1000);
      const auto command = count("find");
      mongoc_cursor_t* cur = mongoc_collection_find_with_opts(c, filter, opts, nullptr);
      const bson_t* doc;
      std::vector<bson_t*> letters;
      std::vector<int64_t> ids;
      while (mongoc_cursor_next(cur, &doc)) {
        int64_t id;
        if (!get_int64(doc, "_id", &id)) continue;  // not addressable; see fail()
        bson_t* dl = bson_new();
        bson_copy_to_excluding_noinit(doc, dl, "attempt", "last_error", "last_status", "not_before", nullptr);
        int64_t attempt = 0;
        get_int64(doc, "attempt", &attempt);
        BSON_APPEND_INT32(dl, "attempts", static_cast<int32_t>(attempt));  // no attempt is charged
        BSON_APPEND_UTF8(dl, "last_error", reason.c_str());
        BSON_APPEND_DATE_TIME(dl, "failed_at", now_ms);
        BSON_APPEND_DATE_TIME(dl, "handler_dropped_at", now_ms);
        letters.push_back(dl);
        ids.push_back(id);
      }
      bool failed = mongoc_cursor_error(cur, &err);
      mongoc_cursor_destroy(cur);
      if (failed) {
        for (bson_t* d : letters) bson_destroy(d);
        raise_store_error("read deliveries of a dropped handler", err);
      }
      if (letters.empty()) break;
      Bson iopts, reply;
      BSON_APPEND_BOOL(iopts, "ordered", false);
      const auto second_command = count("insert");
      bool ok = mongoc_collection_insert_many(coll(kDeadLetters), const_cast<const bson_t**>(letters.data()),
                                              letters.size(), iopts, reply, &err);
      for (bson_t* d : letters) bson_destroy(d);
      if (!ok) {
        auto errs = write_errors(reply);
        if (errs.empty()) raise_store_error("dead-letter deliveries of a dropped handler", err);
        for (const auto& [index, code] : errs)
          if (code != kDuplicateKey) raise_store_error("dead-letter deliveries of a dropped handler", err);
      }
      moved += delete_deliveries(c, ids);
      for (int64_t id : ids) base_ids_.erase(id);
    }
  // Earlier dead letters of the handler too: a handler created again under
  // this name starts empty, and `replay` leaves these alone.
  Bson f, upd, reply;
  BSON_APPEND_UTF8(f, "handler", handler.c_str());
  bson_t ex, set;
  bson_append_document_begin(f, "handler_dropped_at", -1, &ex);
  BSON_APPEND_BOOL(&ex, "$exists", false);
  bson_append_document_end(f, &ex);
  bson_append_document_begin(upd, "$set", -1, &set);
  BSON_APPEND_DATE_TIME(&set, "handler_dropped_at", now_ms);
  bson_append_document_end(upd, &set);
  const auto command = count("update");
  if (!mongoc_collection_update_many(coll(kDeadLetters), f, upd, nullptr, reply, &err))
    raise_store_error("mark dead letters of a dropped handler", err);
  return moved;
}

}  // namespace relaybus::mongo

// ------------------------------------------------------------------ stats

namespace relaybus::mongo {

Store::Backlog Store::backlog(const std::string& handler, int64_t now_ms) {
  Backlog b;
  bson_error_t err;
  auto count_where = [&](mongoc_collection_t* c, const char* field, const char* op, bool date, int64_t v,
                         bool not_dropped) {
    Bson f;
    BSON_APPEND_UTF8(f, "handler", handler.c_str());
    if (field != nullptr) {
      bson_t cond;
      bson_append_document_begin(f, field, -1, &cond);
      if (date)
        BSON_APPEND_DATE_TIME(&cond, op, v);
      else
        BSON_APPEND_INT64(&cond, op, v);
      bson_append_document_end(f, &cond);
    }
    if (not_dropped) {
      bson_t ex;
      bson_append_document_begin(f, "handler_dropped_at", -1, &ex);
      BSON_APPEND_BOOL(&ex, "$exists", false);
      bson_append_document_end(f, &ex);
    }
    const auto command = count("count");
    int64_t n = mongoc_collection_count_documents(c, f, nullptr, nullptr, nullptr, &err);
    if (n < 0) raise_store_error("count", err);
    return n;
  };
  auto count_deliveries_of = [&](const char* field, const char* op, bool date, int64_t v) {
    int64_t n = 0;
    const std::vector<Segment> segs = delivery_collections(0);
    for (const auto& seg : segs) n += count_where(coll(seg.collection.c_str()), field, op, date, v, false);
    return n;
  };
  b.pending = count_deliveries_of(nullptr, nullptr, false, 0);
  if (b.pending > 0) {
    b.delayed = count_deliveries_of("not_before", "$gt", true, now_ms);
    b.ready = b.pending - b.delayed;
    b.retrying = count_deliveries_of("attempt", "$gt", false, 0);
    b.oldest_ms = oldest_published_ms(handler);
  }
  b.dead = count_where(coll(kDeadLetters), nullptr, nullptr, false, 0, true);
  return b;
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

std::map<std::string, Store::HandlerLoad> Store::live_load(int64_t now_ms) {
  std::map<std::string, HandlerLoad> out;
  Bson filter;
  const auto command = count("find");
  mongoc_cursor_t* cur = mongoc_collection_find_with_opts(coll(kInstances), filter, nullptr, nullptr);
  const bson_t* doc;
  while (mongoc_cursor_next(cur, &doc)) {
    int64_t until = 0;
    bson_iter_t it, hs;
    if (!get_date_ms(doc, "until", &until) || until <= now_ms) continue;
    if (!bson_iter_init_find(&it, doc, "load") || !BSON_ITER_HOLDS_DOCUMENT(&it) || !bson_iter_recurse(&it, &hs))
      continue;
    while (bson_iter_next(&hs)) {
      if (!BSON_ITER_HOLDS_DOCUMENT(&hs)) continue;
      uint32_t len;
      const uint8_t* data;
      bson_iter_document(&hs, &len, &data);
      bson_t h;
      if (!bson_init_static(&h, data, len)) continue;
      HandlerLoad& l = out[bson_iter_key(&hs)];
      int64_t x = 0;
      if (get_int64(&h, "in_flight", &x)) l.in_flight += x;
      if (get_int64(&h, "latency_count", &x)) l.latency_count += x;
      bson_iter_t f, arr;
      if (bson_iter_init_find(&f, &h, "latency_sum_s") && BSON_ITER_HOLDS_DOUBLE(&f))
        l.latency_sum_s += bson_iter_double(&f);
      if (bson_iter_init_find(&f, &h, "latency_buckets") && BSON_ITER_HOLDS_ARRAY(&f) && bson_iter_recurse(&f, &arr)) {
        for (size_t i = 0; bson_iter_next(&arr); i++) {
          if (l.latency_buckets.size() <= i) l.latency_buckets.resize(i + 1, 0);
          l.latency_buckets[i] += bson_iter_as_int64(&arr);
        }
      }
    }
  }
  bson_error_t err;
  bool failed = mongoc_cursor_error(cur, &err);
  mongoc_cursor_destroy(cur);
  if (failed) raise_store_error("read instances", err);
  return out;
}

}  // namespace relaybus::mongo
