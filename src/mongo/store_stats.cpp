// Store calls that count (store.hpp): the backlog of a handler, for `stats`,
// /metrics and `handler drop`.
#include "mongo/store.hpp"
#include "mongo/store_docs.hpp"
#include "mongo/util.hpp"

namespace relaybus::mongo {

Store::Backlog Store::backlog(const std::string& handler, int64_t now_ms) {
  Backlog b;
  bson_error_t err;
  auto count_where = [&](mongoc_collection_t* c, const char* field, const char* op, bool date, int64_t v,
                         bool dead_letters) {
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
    if (dead_letters) not_dropped(f);
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

int64_t Store::count_pending(const std::string& handler) {
  Bson f;
  BSON_APPEND_UTF8(f, "handler", handler.c_str());
  return count_deliveries_where(f);
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
