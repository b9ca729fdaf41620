// Store calls of the dead letters (store.hpp): replaying them, and moving a
// dropped handler's deliveries there.
#include "mongo/store.hpp"
#include "mongo/store_docs.hpp"
#include "mongo/util.hpp"

namespace relaybus::mongo {

int64_t Store::replay(const std::string& handler, const std::vector<int64_t>& ids, int64_t now_ms) {
  Bson filter;
  if (!handler.empty()) BSON_APPEND_UTF8(filter, "handler", handler.c_str());
  if (!ids.empty()) id_in(filter, ids);
  not_dropped(filter);
  const auto command = count("find");
  mongoc_cursor_t* cur = mongoc_collection_find_with_opts(coll(kDeadLetters), filter, nullptr, nullptr);
  OwnedDocs docs;
  std::vector<int64_t> moved;
  each_doc(cur, "read dead letters", [&](const bson_t* doc) {
    int64_t id;
    if (!get_int64(doc, "_id", &id)) return;
    bson_t* d = docs.add();
    bson_copy_to_excluding_noinit(doc, d, "attempts", "last_error", "last_status", "failed_at", nullptr);
    BSON_APPEND_INT32(d, "attempt", 0);
    BSON_APPEND_DATE_TIME(d, "not_before", now_ms);
    moved.push_back(id);
  });
  if (docs.empty()) return 0;
  insert_idempotent(kDeliveries, docs.get(), "replay");  // duplicates: replayed already
  Bson df, dr;
  id_in(df, moved);
  bson_error_t err;
  const auto deleting = count("delete");
  if (!mongoc_collection_delete_many(coll(kDeadLetters), df, nullptr, dr, &err)) raise_store_error("replay", err);
  return static_cast<int64_t>(moved.size());
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
      OwnedDocs letters;
      std::vector<int64_t> ids;
      each_doc(cur, "read deliveries of a dropped handler", [&](const bson_t* doc) {
        int64_t id;
        if (!get_int64(doc, "_id", &id)) return;  // not addressable; see fail()
        bson_t* dl = letters.add();
        bson_copy_to_excluding_noinit(doc, dl, "attempt", "last_error", "last_status", "not_before", nullptr);
        int64_t attempt = 0;
        get_int64(doc, "attempt", &attempt);
        BSON_APPEND_INT32(dl, "attempts", static_cast<int32_t>(attempt));  // no attempt is charged
        BSON_APPEND_UTF8(dl, "last_error", reason.c_str());
        BSON_APPEND_DATE_TIME(dl, "failed_at", now_ms);
        BSON_APPEND_DATE_TIME(dl, "handler_dropped_at", now_ms);
        ids.push_back(id);
      });
      if (letters.empty()) break;
      insert_idempotent(kDeadLetters, letters.get(), "dead-letter deliveries of a dropped handler");
      moved += delete_deliveries(c, ids);
      for (int64_t id : ids) base_ids_.erase(id);
    }
  // Earlier dead letters of the handler too: a handler created again under
  // this name starts empty, and `replay` leaves these alone.
  Bson f, upd, reply;
  BSON_APPEND_UTF8(f, "handler", handler.c_str());
  not_dropped(f);
  bson_t set;
  bson_append_document_begin(upd, "$set", -1, &set);
  BSON_APPEND_DATE_TIME(&set, "handler_dropped_at", now_ms);
  bson_append_document_end(upd, &set);
  const auto command = count("update");
  if (!mongoc_collection_update_many(coll(kDeadLetters), f, upd, nullptr, reply, &err))
    raise_store_error("mark dead letters of a dropped handler", err);
  return moved;
}

}  // namespace relaybus::mongo
