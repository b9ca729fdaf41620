// Store calls of the outbox and the sequencer (declared in store.hpp). Every
// write here is idempotent: a sequencer that crashed, or lost its role, and
// whose work is redone writes the same documents again (duplicates count as done).
#include <cstdlib>
#include <cstring>

#include "mongo/outbox.hpp"
#include "mongo/outbox_order.hpp"
#include "mongo/store.hpp"
#include "mongo/store_docs.hpp"
#include "mongo/util.hpp"

namespace relaybus::mongo {

namespace {

std::vector<std::shared_ptr<bson_t>> drain(mongoc_cursor_t* cur, const char* what) {
  std::vector<std::shared_ptr<bson_t>> out;
  each_doc(cur, what, [&](const bson_t* doc) { out.emplace_back(bson_copy(doc), bson_destroy); });
  return out;
}

// {field: {$in: [strings]}}
void string_in(bson_t* filter, const char* field, const std::vector<std::string>& v) {
  bson_t in, arr;
  bson_append_document_begin(filter, field, -1, &in);
  bson_append_array_begin(&in, "$in", 3, &arr);
  for (size_t i = 0; i < v.size(); i++) BSON_APPEND_UTF8(&arr, std::to_string(i).c_str(), v[i].c_str());
  bson_append_array_end(&in, &arr);
  bson_append_document_end(filter, &in);
}

}  // namespace

void Store::insert_outbox(const bson_t* doc) {
  Bson reply;
  bson_error_t err;
  const auto command = count("insert");
  if (!mongoc_collection_insert_one(coll(kOutbox), doc, nullptr, reply, &err))
    raise_store_error("insert into relay_outbox", err);
}

void Store::insert_outbox_many(const std::vector<const bson_t*>& docs) {
  if (docs.empty()) return;
  Bson reply;
  bson_error_t err;
  const auto command = count("insert");
  std::vector<const bson_t*> v(docs);
  if (!mongoc_collection_insert_many(coll(kOutbox), v.data(), v.size(), nullptr, reply, &err))
    raise_store_error("insert into relay_outbox", err);
}

std::vector<std::shared_ptr<bson_t>> Store::read_outbox(int limit) {
  Bson filter, opts;
  if (!is_ferretdb()) {
    bson_t sort;
    bson_append_document_begin(opts, "sort", 4, &sort);
    BSON_APPEND_INT32(&sort, "_id", 1);
    bson_append_document_end(opts, &sort);
    BSON_APPEND_INT64(opts, "limit", limit);
    BSON_APPEND_INT32(opts, "batchSize", limit);
    const auto command = count("find");
    return drain(mongoc_collection_find_with_opts(coll(kOutbox), filter, opts, nullptr), "read relay_outbox");
  }
  // FerretDB: no sort and no limit. A sort would be done in Go over the whole
  // outbox for every batch; a limit cuts the physical order, which on its
  // PostgreSQL backend is not the insertion order. The find and its getMores
  // read one cursor of one SQL statement: one snapshot (outbox_order.hpp).
  static const size_t max_docs = [] {
    const char* v = getenv("RELAYBUS_MONGO_OUTBOX_SNAPSHOT_DOCS");  // a test hook: the cap, lowered
    return v != nullptr && atol(v) > 0 ? static_cast<size_t>(atol(v)) : kOutboxSnapshotDocs;
  }();
  OutboxSnapshot snap(max_docs, kOutboxSnapshotBytes);
  const auto command = count("find");
  each_doc(mongoc_collection_find_with_opts(coll(kOutbox), filter, opts, nullptr), "read relay_outbox",
           [&](const bson_t* doc) { snap.add(doc); });
  return snap.take();
}

// {_id: {$in: [the _id of each of `docs`]}} into `filter`.
void Store::append_id_in(bson_t* filter, const std::vector<const bson_t*>& docs) {
  bson_t in, arr;
  bson_append_document_begin(filter, "_id", 3, &in);
  bson_append_array_begin(&in, "$in", 3, &arr);
  for (size_t i = 0; i < docs.size(); i++) {
    bson_iter_t it;
    if (bson_iter_init_find(&it, docs[i], "_id")) bson_append_iter(&arr, std::to_string(i).c_str(), -1, &it);
  }
  bson_append_array_end(&in, &arr);
  bson_append_document_end(filter, &in);
}

std::vector<std::shared_ptr<bson_t>> Store::read_outbox_ids(const std::vector<const bson_t*>& ids) {
  if (ids.empty()) return {};
  Bson filter;
  append_id_in(filter, ids);
  const auto command = count("find");
  return drain(mongoc_collection_find_with_opts(coll(kOutbox), filter, nullptr, nullptr), "read relay_outbox");
}

std::shared_ptr<bson_t> Store::read_top_version() {
  Bson filter, opts;
  bson_t sort;
  bson_append_document_begin(opts, "sort", 4, &sort);
  BSON_APPEND_INT32(&sort, "_id", -1);
  bson_append_document_end(opts, &sort);
  BSON_APPEND_INT64(opts, "limit", 1);
  const auto command = count("find");
  auto docs = drain(mongoc_collection_find_with_opts(coll(kSequence), filter, opts, nullptr), "read relay_sequence");
  return docs.empty() ? nullptr : docs[0];
}

bool Store::read_counter(const char* id, int64_t* n) {
  Bson filter;
  BSON_APPEND_UTF8(filter, "_id", id);
  const auto command = count("find");
  auto docs = drain(mongoc_collection_find_with_opts(coll(kCounters), filter, nullptr, nullptr), "read relay_counters");
  return !docs.empty() && get_int64(docs[0].get(), "n", n);
}

void Store::read_inserted_bound() {
  int64_t n = 0;
  // None: no sequencer of this version has run, and the reads are not bounded (as they were).
  inserted_bound_ = read_counter("inserted_below", &n) ? n - 1 : INT64_MAX;
}

void Store::raise_inserted_below(int64_t next_id) {
  Bson filter, update, opts, reply;
  bson_t max;
  BSON_APPEND_UTF8(filter, "_id", "inserted_below");
  bson_append_document_begin(update, "$max", 4, &max);
  BSON_APPEND_INT64(&max, "n", next_id);
  bson_append_document_end(update, &max);
  BSON_APPEND_BOOL(opts, "upsert", true);
  bson_error_t err;
  const auto command = count("update");
  if (!mongoc_collection_update_one(coll(kCounters), filter, update, opts, reply, &err) && err.code != kDuplicateKey)
    raise_store_error("record the inserted deliveries' bound", err);
}

bool Store::insert_version(const bson_t* doc) { return insert_new(kSequence, doc, "insert into relay_sequence"); }

void Store::delete_versions_below(int64_t version) {
  Bson filter, reply;
  bson_t lt;
  bson_append_document_begin(filter, "_id", 3, &lt);
  BSON_APPEND_INT64(&lt, "$lt", version);
  bson_append_document_end(filter, &lt);
  bson_error_t err;
  const auto command = count("delete");
  if (!mongoc_collection_delete_many(coll(kSequence), filter, nullptr, reply, &err))
    raise_store_error("trim relay_sequence", err);
}

int64_t Store::read_id_counter() {
  int64_t n = 0;
  return read_counter("ids", &n) ? n : 0;
}

std::map<std::string, int64_t> Store::read_key_seqs(const std::vector<std::string>& keys) {
  std::map<std::string, int64_t> out;
  if (keys.empty()) return out;
  Bson filter;
  string_in(filter, "_id", keys);
  const auto command = count("find");
  for (const auto& d :
       drain(mongoc_collection_find_with_opts(coll(kKeySeqs), filter, nullptr, nullptr), "read relay_key_seqs")) {
    std::string k;
    int64_t s = 0;
    if (get_string(d.get(), "_id", &k) && get_int64(d.get(), "seq", &s)) out[k] = s;
  }
  return out;
}

void Store::raise_key_seqs(const std::map<std::string, int64_t>& seqs) {
  // At most kStatements updates per command: FerretDB v1.24 keeps a SQLite
  // connection per update statement until its command ends, and an update
  // command of ~100 statements exhausts its pool and hangs the server
  // (measured: 100 upserts in one bulk; 50 pass).
  constexpr size_t kStatements = 25;
  auto it = seqs.begin();
  while (it != seqs.end()) {
    Bson bopts;
    BSON_APPEND_BOOL(bopts, "ordered", false);
    mongoc_bulk_operation_t* bulk = mongoc_collection_create_bulk_operation_with_opts(coll(kKeySeqs), bopts);
    bson_error_t err;
    for (size_t n = 0; n < kStatements && it != seqs.end(); n++, ++it) {
      Bson sel, upd, uopts;
      BSON_APPEND_UTF8(sel, "_id", it->first.c_str());
      bson_t max;
      bson_append_document_begin(upd, "$max", 4, &max);
      BSON_APPEND_INT64(&max, "seq", it->second);
      bson_append_document_end(upd, &max);
      BSON_APPEND_BOOL(uopts, "upsert", true);
      mongoc_bulk_operation_update_one_with_opts(bulk, sel, upd, uopts, &err);
    }
    Bson reply;
    const auto command = count("update");
    uint32_t ok = mongoc_bulk_operation_execute(bulk, reply, &err);
    mongoc_bulk_operation_destroy(bulk);
    if (ok) continue;
    // Two first upserts of one key (a stale sequencer's redo): the other one did it.
    auto errs = write_errors(reply);
    if (errs.empty()) raise_store_error("record key seqs", err);
    for (const auto& [index, code] : errs)
      if (code != kDuplicateKey) raise_store_error("record key seqs", err);
  }
}

std::map<std::string, int64_t> Store::read_dedupe(const std::vector<std::string>& keys) {
  std::map<std::string, int64_t> out;
  if (keys.empty()) return out;
  Bson filter;
  string_in(filter, "_id", keys);
  const auto command = count("find");
  for (const auto& d :
       drain(mongoc_collection_find_with_opts(coll(kDedupe), filter, nullptr, nullptr), "read relay_dedupe")) {
    std::string k;
    int64_t e = 0;
    if (get_string(d.get(), "_id", &k) && get_int64(d.get(), "event_id", &e)) out[k] = e;
  }
  return out;
}

void Store::insert_idempotent(const char* collection, const std::vector<bson_t*>& docs, const char* what) {
  if (docs.empty()) return;
  Bson opts, reply;
  BSON_APPEND_BOOL(opts, "ordered", false);
  bson_error_t err;
  const auto command = count("insert");
  if (mongoc_collection_insert_many(coll(collection), const_cast<const bson_t**>(docs.data()), docs.size(), opts, reply,
                                    &err))
    return;
  auto errs = write_errors(reply);
  if (errs.empty()) raise_store_error(what, err);
  for (const auto& [index, code] : errs)
    if (code != kDuplicateKey) raise_store_error(what, err);
}

int64_t Store::delete_ids(const char* collection, const std::vector<const bson_t*>& ids, const char* what) {
  if (ids.empty()) return 0;
  Bson filter, reply;
  append_id_in(filter, ids);
  bson_error_t err;
  const auto command = count("delete");
  if (!mongoc_collection_delete_many(coll(collection), filter, nullptr, reply, &err)) raise_store_error(what, err);
  int64_t n = 0;
  get_int64(reply, "deletedCount", &n);
  return n;
}

int64_t Store::count_outbox() { return count_all(kOutbox, "count relay_outbox"); }

bool Store::is_ferretdb() {
  if (ferretdb_ >= 0) return ferretdb_ == 1;
  Bson cmd, reply;
  BSON_APPEND_INT32(cmd, "buildInfo", 1);
  bson_error_t err;
  const auto command = count("buildInfo");
  if (!mongoc_client_command_simple(client_, "admin", cmd, nullptr, reply, &err)) raise_store_error("buildInfo", err);
  bson_iter_t it;
  ferretdb_ = bson_iter_init_find(&it, reply, "ferretdbVersion") ? 1 : 0;
  return ferretdb_ == 1;
}

bool Store::keeps_insertion_order() {
  if (insertion_order_ >= 0) return insertion_order_ == 1;
  if (!is_ferretdb()) {
    insertion_order_ = 0;
    return false;
  }
  Bson cmd, reply;
  BSON_APPEND_UTF8(cmd, "getLog", "startupWarnings");
  bson_error_t err;
  const auto command = count("getLog");
  if (!mongoc_client_command_simple(client_, "admin", cmd, nullptr, reply, &err)) raise_store_error("getLog", err);
  // A JSON log line whose msg is "Powered by FerretDB v1.24.2 and SQLite
  // 3.46.0." once its backend is connected (the claim asks after the lease
  // commands), "Powered by FerretDB v1.24.2." before: then the safe answer.
  bson_iter_t it, line;
  if (bson_iter_init_find(&it, reply, "log") && BSON_ITER_HOLDS_ARRAY(&it) && bson_iter_recurse(&it, &line))
    while (insertion_order_ < 0 && bson_iter_next(&line))
      if (BSON_ITER_HOLDS_UTF8(&line) && strstr(bson_iter_utf8(&line, nullptr), "Powered by FerretDB ") != nullptr)
        insertion_order_ = strstr(bson_iter_utf8(&line, nullptr), " and SQLite ") != nullptr ? 1 : 0;
  if (insertion_order_ < 0) insertion_order_ = 0;
  log_info("FerretDB's unsorted reads", {{"insertion_order", insertion_order_ == 1}});
  return insertion_order_ == 1;
}

}  // namespace relaybus::mongo
