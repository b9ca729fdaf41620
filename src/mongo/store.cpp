// The store's client and schema (store.hpp): the driver's setup, the
// collections and their indexes. The calls of each kind of document are in
// store_catalog.cpp, store_lanes.cpp, store_deliveries.cpp,
// store_dead_letters.cpp, store_stats.cpp, segments.cpp and outbox_store.cpp.
#include "mongo/store.hpp"

#include <cstring>
#include <mutex>

#include "mongo/command_trace.hpp"
#include "mongo/outbox.hpp"
#include "mongo/store_docs.hpp"
#include "mongo/util.hpp"

namespace relaybus::mongo {

void raise_store_error(const char* what, const bson_error_t& err) {
  throw StoreError(std::string(what) + ": " + err.message, static_cast<int>(err.code));
}

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

// Once per process, before the first client.
void mongo_global_init() {
  static std::once_flag once;
  std::call_once(once, [] {
    mongoc_log_set_handler(mongoc_log, nullptr);
    mongoc_init();
    atexit(mongoc_cleanup);
  });
}
}  // namespace

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

bool Store::insert_new(const char* collection, const bson_t* doc, const char* what) {
  Bson reply;
  bson_error_t err;
  const auto command = count("insert");
  if (mongoc_collection_insert_one(coll(collection), doc, nullptr, reply, &err)) return true;
  if (err.code == kDuplicateKey) return false;
  for (const auto& [index, code] : write_errors(reply))
    if (code == kDuplicateKey) return false;
  raise_store_error(what, err);
}

int64_t Store::delete_id(const char* collection, const std::string& id, const char* what) {
  Bson filter, reply;
  BSON_APPEND_UTF8(filter, "_id", id.c_str());
  bson_error_t err;
  const auto command = count("delete");
  if (!mongoc_collection_delete_one(coll(collection), filter, nullptr, reply, &err)) raise_store_error(what, err);
  int64_t n = 0;
  get_int64(reply, "deletedCount", &n);
  return n;
}

}  // namespace relaybus::mongo
