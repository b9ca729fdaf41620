#include "mongo/sequencer.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/lane_hash.hpp"
#include "core/route_resolver.hpp"
#include "core/trace_context.hpp"
#include "mongo/outbox.hpp"
#include "mongo/util.hpp"

namespace relaybus::mongo {

namespace {
constexpr int64_t kRotateEveryMs = 1000;

using BsonPtr = std::shared_ptr<bson_t>;
BsonPtr owned(bson_t* b) { return BsonPtr(b, bson_destroy); }

// {_id: <the value of doc's field `field`>}
BsonPtr id_doc(const bson_t* doc, const char* field) {
  bson_iter_t it;
  if (!bson_iter_init_find(&it, doc, field)) return nullptr;
  bson_t* d = bson_new();
  bson_append_iter(d, "_id", 3, &it);
  return owned(d);
}

// The outbox document's headers without a malformed traceparent (and its
// tracestate) or tracestate, as relay_publish leaves them out
// (docs/tracing.md); nullptr: they go to the deliveries as they are.
BsonPtr trace_checked_headers(const bson_t* outbox, std::string* dropped) {
  bson_iter_t it, child;
  if (!bson_iter_init_find(&it, outbox, "headers") || !BSON_ITER_HOLDS_DOCUMENT(&it)) return nullptr;
  bool has_tp = false, has_ts = false, tp_ok = false, ts_ok = false;
  if (!bson_iter_recurse(&it, &child)) return nullptr;
  while (bson_iter_next(&child)) {
    const std::string_view k = bson_iter_key(&child);
    if (k != "traceparent" && k != "tracestate") continue;
    uint32_t len = 0;
    const char* v = BSON_ITER_HOLDS_UTF8(&child) ? bson_iter_utf8(&child, &len) : nullptr;
    const bool ok = v != nullptr && (k == "traceparent" ? core::valid_traceparent(std::string_view(v, len))
                                                        : core::valid_tracestate(std::string_view(v, len)));
    (k == "traceparent" ? has_tp : has_ts) = true;
    (k == "traceparent" ? tp_ok : ts_ok) = ok;
  }
  const bool drop_tp = has_tp && !tp_ok;
  const bool drop_ts = has_ts && (drop_tp || !ts_ok);
  if (!drop_tp && !drop_ts) return nullptr;
  *dropped = drop_tp ? "traceparent" : "tracestate";
  BsonPtr out = owned(bson_new());
  bson_iter_recurse(&it, &child);
  while (bson_iter_next(&child)) {
    const std::string_view k = bson_iter_key(&child);
    if ((drop_tp && k == "traceparent") || (drop_ts && k == "tracestate")) continue;
    bson_append_iter(out.get(), bson_iter_key(&child), -1, &child);
  }
  return out;
}
}  // namespace

struct Sequencer::Event {
  BsonPtr id;      // {_id: the outbox document's _id}
  BsonPtr outbox;  // the outbox document; null once removed (then its deliveries exist)
  std::string id_json;
  int64_t event_id = 0;  // 0: rejected or folded
  bool has_key = false;
  std::string key;
  int64_t seq = 0;
  std::vector<std::pair<std::string, std::string>> handlers;  // (name, wire name or "")
  std::string dedupe;
  std::string rejected;
  int64_t folded = 0;  // the event a repeated dedupe_key folded into
  int priority = 1;
  int64_t not_before_ms = 0;  // 0: at
};

struct Sequencer::Version {
  int64_t v = 0;
  int64_t epoch = 0;
  std::string owner;
  int64_t at_ms = 0;
  int64_t next_id = 1;
  std::vector<Event> events;
};

Sequencer::Sequencer(Store& store, std::string owner, int max_key_bytes)
    : store_(store), owner_(std::move(owner)), max_key_bytes_(max_key_bytes) {}

void Sequencer::begin(int64_t epoch) {
  epoch_ = epoch;
  recovered_ = false;
  key_seqs_.clear();
  unread_.clear();
}

void Sequencer::end() {
  epoch_ = 0;
  recovered_ = false;
  key_seqs_.clear();
  unread_.clear();
}

void Sequencer::load_catalog() {
  handlers_.clear();
  for (const auto& h : store_.load_handlers(nullptr)) handlers_.push_back(h.name);
  // A handler's key in the resolver is its index here: decisions then come in
  // name order, the order of an event's "h" array and so of its deliveries' _ids.
  std::sort(handlers_.begin(), handlers_.end());
  std::vector<core::RouteInput> routes;
  for (auto& r : store_.load_routes()) {
    auto h = std::lower_bound(handlers_.begin(), handlers_.end(), r.handler);
    if (h == handlers_.end() || *h != r.handler) continue;  // a route left by a dropped handler
    core::RouteInput in;
    in.handler = h - handlers_.begin();
    in.pattern = std::move(r.pattern);
    if (!r.wire_name.empty()) in.wire_name = std::move(r.wire_name);
    routes.push_back(std::move(in));
  }
  routes_ = core::RouteResolver(std::move(routes));
}

// ------------------------------------------------------------ version documents

namespace {

void append_version(bson_t* d, int64_t v, int64_t epoch, const std::string& owner, int64_t at_ms, int64_t next_id) {
  BSON_APPEND_INT64(d, "_id", v);
  BSON_APPEND_INT64(d, "epoch", epoch);
  BSON_APPEND_UTF8(d, "owner", owner.c_str());
  BSON_APPEND_DATE_TIME(d, "at", at_ms);
  BSON_APPEND_INT64(d, "next_id", next_id);
}

}  // namespace

// ------------------------------------------------------------ recovery and apply

bool Sequencer::recover(const std::function<bool()>& holds) {
  key_seqs_.clear();
  version_ = 0;
  next_id_ = store_.read_id_counter() + 1;  // ids drawn by 0.1.0 publishers stay taken
  BsonPtr top = store_.read_top_version();
  if (top) {
    Version v;
    get_int64(top.get(), "_id", &v.v);
    get_int64(top.get(), "epoch", &v.epoch);
    get_string(top.get(), "owner", &v.owner);
    get_date_ms(top.get(), "at", &v.at_ms);
    get_int64(top.get(), "next_id", &v.next_id);
    each_embedded(top.get(), "events", BSON_TYPE_ARRAY, [&](const char*, const bson_t* e) {
      Event ev;
      ev.id = id_doc(e, "o");
      if (!ev.id) return;
      bson_iter_t f;
      if (bson_iter_init_find(&f, e, "o")) ev.id_json = bson_value_to_json(bson_iter_value(&f));
      get_int64(e, "e", &ev.event_id);
      ev.has_key = get_string(e, "k", &ev.key);
      get_int64(e, "s", &ev.seq);
      get_string(e, "d", &ev.dedupe);
      get_string(e, "r", &ev.rejected);
      get_int64(e, "f", &ev.folded);
      int64_t x = 1;
      if (get_int64(e, "p", &x)) ev.priority = static_cast<int>(x);
      get_date_ms(e, "nb", &ev.not_before_ms);
      each_embedded(e, "h", BSON_TYPE_ARRAY, [&](const char*, const bson_t* hd) {
        std::string n, w;
        get_string(hd, "n", &n);
        get_string(hd, "w", &w);
        ev.handlers.emplace_back(n, w);
      });
      v.events.push_back(std::move(ev));
    });
    // The outbox documents this version took that are still there.
    std::vector<const bson_t*> ids;
    for (const auto& ev : v.events) ids.push_back(ev.id.get());
    std::map<std::string, BsonPtr> present;
    for (auto& d : store_.read_outbox_ids(ids)) {
      bson_iter_t f;
      if (bson_iter_init_find(&f, d.get(), "_id")) present[bson_value_to_json(bson_iter_value(&f))] = d;
    }
    for (auto& ev : v.events) {
      auto p = present.find(ev.id_json);
      if (p != present.end()) ev.outbox = p->second;
    }
    version_ = v.v;
    next_id_ = std::max(next_id_, v.next_id);
    log_info("sequencer recovering", {{"version", v.v},
                                      {"by", v.owner},
                                      {"epoch", v.epoch},
                                      {"events", v.events.size()},
                                      {"outbox_left", present.size()},
                                      {"next_id", next_id_}});
    if (!apply(v, holds)) return false;
    sequenced_ += present.size();  // the outbox documents this redo consumed
  }
  // Every id below next_id_ is inserted now: readers' bound, before this
  // tenure's first version (a database whose sequencer predates the bound has none).
  if (!holds()) return false;
  store_.raise_inserted_below(next_id_);
  recovered_ = true;
  return true;
}

bool Sequencer::apply(const Version& v, const std::function<bool()>& holds) {
  // 1. Key seqs: the next holder reads a key's last seq from relay_key_seqs.
  std::map<std::string, int64_t> seqs;
  for (const auto& ev : v.events)
    if (ev.event_id > 0 && ev.has_key) seqs[ev.key] = std::max(seqs[ev.key], ev.seq);
  if (!seqs.empty()) {
    if (!holds()) return false;
    store_.raise_key_seqs(seqs);
  }
  crash_point("after_key_seqs");
  // 2. Dedupe records and rejects.
  std::vector<bson_t*> dedupe, rejects;
  for (const auto& ev : v.events) {
    bson_iter_t it;
    if (ev.event_id > 0 && !ev.dedupe.empty()) {
      bson_t* d = bson_new();
      BSON_APPEND_UTF8(d, "_id", ev.dedupe.c_str());
      BSON_APPEND_INT64(d, "event_id", ev.event_id);
      if (bson_iter_init_find(&it, ev.id.get(), "_id")) bson_append_iter(d, "outbox_id", -1, &it);
      BSON_APPEND_DATE_TIME(d, "at", v.at_ms);
      dedupe.push_back(d);
    }
    if (!ev.rejected.empty() && ev.outbox) {
      bson_t* d = bson_new();
      bson_copy_to_excluding_noinit(ev.outbox.get(), d, "error", "rejected_at", nullptr);
      BSON_APPEND_UTF8(d, "error", ev.rejected.c_str());
      BSON_APPEND_DATE_TIME(d, "rejected_at", v.at_ms);
      rejects.push_back(d);
    }
  }
  auto free_all = [](std::vector<bson_t*>& docs) {
    for (bson_t* d : docs) bson_destroy(d);
    docs.clear();
  };
  try {
    if ((!dedupe.empty() || !rejects.empty()) && !holds()) {
      free_all(dedupe);
      free_all(rejects);
      return false;
    }
    store_.insert_idempotent(kDedupe, dedupe, "record dedupe keys");
    store_.insert_idempotent(kOutboxRejects, rejects, "record rejected outbox documents");
  } catch (...) {
    free_all(dedupe);
    free_all(rejects);
    throw;
  }
  free_all(dedupe);
  free_all(rejects);
  // 3. Deliveries, with deterministic _ids: a redo inserts the same ones (duplicates = done).
  std::vector<bson_t*> deliveries;
  for (const auto& ev : v.events) {
    if (ev.event_id <= 0 || !ev.outbox) continue;
    const int lane = ev.has_key ? core::lane_for_key(ev.key) : core::lane_for_unkeyed(ev.event_id);
    std::string topic;
    get_string(ev.outbox.get(), "topic", &topic);
    std::string dropped;
    const BsonPtr checked = trace_checked_headers(ev.outbox.get(), &dropped);
    if (checked) {
      trace_context_ignored_++;
      log_warn("ignoring a malformed " + dropped + " in an outbox document's headers",
               {{"outbox_id", ev.id_json}, {"event_id", ev.event_id}});
    }
    for (size_t i = 0; i < ev.handlers.size(); i++) {
      const int64_t id = ev.event_id + static_cast<int64_t>(i);
      bson_t* d = bson_new();
      BSON_APPEND_INT64(d, "_id", id);
      BSON_APPEND_INT64(d, "event_id", ev.event_id);
      BSON_APPEND_UTF8(d, "handler", ev.handlers[i].first.c_str());
      BSON_APPEND_INT32(d, "lane", lane);
      if (ev.has_key) BSON_APPEND_UTF8(d, "key", ev.key.c_str());
      BSON_APPEND_INT64(d, "seq", ev.has_key ? ev.seq : id);
      BSON_APPEND_INT32(d, "priority", ev.priority);
      BSON_APPEND_DATE_TIME(d, "not_before", ev.not_before_ms > 0 ? ev.not_before_ms : v.at_ms);
      BSON_APPEND_DATE_TIME(d, "published_at", v.at_ms);
      BSON_APPEND_INT32(d, "attempt", 0);
      BSON_APPEND_UTF8(d, "topic", topic.c_str());
      if (!ev.handlers[i].second.empty()) BSON_APPEND_UTF8(d, "wire_topic", ev.handlers[i].second.c_str());
      bson_iter_t it;
      if (bson_iter_init_find(&it, ev.outbox.get(), "payload")) bson_append_iter(d, "payload", -1, &it);
      if (checked)
        BSON_APPEND_DOCUMENT(d, "headers", checked.get());
      else if (bson_iter_init_find(&it, ev.outbox.get(), "headers") && BSON_ITER_HOLDS_DOCUMENT(&it))
        bson_append_iter(d, "headers", -1, &it);
      if (bson_iter_init_find(&it, ev.id.get(), "_id")) bson_append_iter(d, "outbox_id", -1, &it);
      deliveries.push_back(d);
    }
  }
  // Their segments first (with the priority classes), so no reader misses them.
  std::map<int64_t, unsigned> classes_by_segment;
  for (const auto& ev : v.events) {
    if (ev.event_id <= 0 || !ev.outbox) continue;
    const unsigned cls = ev.priority >= 0 && ev.priority <= 3 ? 1u << ev.priority : 0xFu;
    for (size_t i = 0; i < ev.handlers.size(); i++) {
      const int64_t id = ev.event_id + static_cast<int64_t>(i);
      classes_by_segment[id - id % kSegmentIds] |= cls;
    }
  }
  try {
    if (!deliveries.empty() && !holds()) {
      free_all(deliveries);
      return false;
    }
    pause_point("before_deliveries", std::to_string(v.v));
    store_.prepare_segments(classes_by_segment);
    if (!deliveries.empty() && !holds()) {
      free_all(deliveries);
      return false;
    }
    store_.insert_deliveries(deliveries);
  } catch (...) {
    free_all(deliveries);
    throw;
  }
  free_all(deliveries);
  // Readers may now read this version's deliveries (Store::read_inserted_bound):
  // the inserts above went to up to two segments one after the other, and a
  // reader between them would see a key's newer delivery without its older one.
  store_.raise_inserted_below(v.next_id);
  crash_point("after_deliveries");
  // 4. The outbox documents, last.
  std::vector<const bson_t*> ids;
  for (const auto& ev : v.events)
    if (ev.outbox) ids.push_back(ev.id.get());
  if (!ids.empty()) {
    if (!holds()) return false;
    store_.delete_ids(kOutbox, ids, "remove outbox documents");
  }
  crash_point("after_outbox");
  // 5. Older versions: the top one keeps next_id.
  store_.delete_versions_below(v.v);
  return true;
}

// ------------------------------------------------------------ a batch

int Sequencer::step(int limit, int64_t now_ms, const std::function<bool()>& holds) {
  if (!active()) return 0;
  if (!recovered_ && !recover(holds)) return 0;
  // Rotation: drained segments below every id assigned so far go (the
  // recovered top version is applied, so nothing inserts below next_id_).
  if (now_ms - rotated_ms_ >= kRotateEveryMs && holds()) {
    rotated_ms_ = now_ms;
    if (int n = store_.drop_drained_segments(next_id_); n > 0)
      log_debug("delivery segments dropped", {{"segments", n}, {"below_id", next_id_}});
  }
  // Whatever ends this step before the batch is applied drops the rest of
  // the read: a later batch of it must never be sequenced before this one.
  struct DropUnread {
    std::deque<std::shared_ptr<bson_t>>& q;
    bool keep = false;
    ~DropUnread() {
      if (!keep) q.clear();
    }
  } drop_unread{unread_};
  if (unread_.empty())
    for (auto& d : store_.read_outbox(limit)) unread_.push_back(std::move(d));
  const size_t n_take = std::min(unread_.size(), static_cast<size_t>(std::max(limit, 1)));
  std::vector<std::shared_ptr<bson_t>> docs(unread_.begin(), unread_.begin() + n_take);
  if (docs.empty()) return 0;
  // Read after the documents, not cached: a handler or route created before
  // an event was inserted into the outbox applies to it (two small finds).
  load_catalog();

  std::vector<OutboxEntry> entries;
  std::vector<std::string> uncached, dedupe_keys;
  for (const auto& d : docs) {
    entries.push_back(parse_outbox_doc(d.get(), max_key_bytes_));
    const OutboxEntry& e = entries.back();
    if (!e.malformed.empty()) continue;
    if (e.has_key && !key_seqs_.count(e.key)) uncached.push_back(e.key);
    if (!e.dedupe_key.empty()) dedupe_keys.push_back(e.dedupe_key);
  }
  std::sort(uncached.begin(), uncached.end());
  uncached.erase(std::unique(uncached.begin(), uncached.end()), uncached.end());
  if (!uncached.empty()) {
    if (key_seqs_.size() > 100000) key_seqs_.clear();  // bounded; reloaded lazily
    auto loaded = store_.read_key_seqs(uncached);
    for (const auto& k : uncached) key_seqs_[k] = loaded.count(k) ? loaded[k] : 0;
  }
  std::map<std::string, int64_t> seen_dedupe = store_.read_dedupe(dedupe_keys);

  Version v;
  v.v = version_ + 1;
  v.epoch = epoch_;
  v.owner = owner_;
  v.at_ms = now_ms;
  int64_t next = next_id_;
  std::map<std::string, int64_t> batch_seqs;
  std::vector<core::RouteResolver::Decision> decisions;
  for (size_t i = 0; i < docs.size(); i++) {
    const OutboxEntry& e = entries[i];
    Event ev;
    ev.id = id_doc(docs[i].get(), "_id");
    if (!ev.id) continue;  // every stored document has an _id
    ev.outbox = docs[i];
    ev.id_json = e.id_json;
    if (!e.malformed.empty()) {
      ev.rejected = e.malformed;
      v.events.push_back(std::move(ev));
      continue;
    }
    ev.dedupe = e.dedupe_key;
    if (!e.dedupe_key.empty()) {
      auto s = seen_dedupe.find(e.dedupe_key);
      if (s != seen_dedupe.end()) {
        ev.folded = s->second;
        ev.dedupe.clear();
        v.events.push_back(std::move(ev));
        continue;
      }
    }
    decisions.clear();
    routes_.resolve(e.topic, &decisions);
    for (const auto& d : decisions) ev.handlers.emplace_back(handlers_[d.handler], d.route->wire_name.value_or(""));
    ev.event_id = next;
    next += std::max<int64_t>(1, static_cast<int64_t>(ev.handlers.size()));
    if (e.has_key) {
      ev.has_key = true;
      ev.key = e.key;
      auto b = batch_seqs.find(e.key);
      ev.seq = (b != batch_seqs.end() ? b->second : key_seqs_[e.key]) + 1;
      batch_seqs[e.key] = ev.seq;
    }
    ev.priority = e.priority;
    if (e.has_not_before) ev.not_before_ms = e.not_before_ms;
    if (!e.dedupe_key.empty()) seen_dedupe[e.dedupe_key] = ev.event_id;  // a repeat in this batch folds too
    v.events.push_back(std::move(ev));
  }
  v.next_id = next;

  // The commit: version v + 1, unique. Whoever inserted it owns this batch's ids and seqs.
  Bson doc;
  append_version(doc, v.v, v.epoch, v.owner, v.at_ms, v.next_id);
  bson_t arr;
  bson_append_array_begin(doc, "events", -1, &arr);
  for (size_t i = 0; i < v.events.size(); i++) {
    const Event& ev = v.events[i];
    bson_t e, hs;
    bson_append_document_begin(&arr, std::to_string(i).c_str(), -1, &e);
    bson_iter_t it;
    if (bson_iter_init_find(&it, ev.id.get(), "_id")) bson_append_iter(&e, "o", 1, &it);
    if (ev.event_id > 0) {
      BSON_APPEND_INT64(&e, "e", ev.event_id);
      if (ev.has_key) {
        BSON_APPEND_UTF8(&e, "k", ev.key.c_str());
        BSON_APPEND_INT64(&e, "s", ev.seq);
      }
      BSON_APPEND_INT32(&e, "p", ev.priority);
      if (ev.not_before_ms > 0) BSON_APPEND_DATE_TIME(&e, "nb", ev.not_before_ms);
      bson_append_array_begin(&e, "h", 1, &hs);
      for (size_t j = 0; j < ev.handlers.size(); j++) {
        bson_t h;
        bson_append_document_begin(&hs, std::to_string(j).c_str(), -1, &h);
        BSON_APPEND_UTF8(&h, "n", ev.handlers[j].first.c_str());
        if (!ev.handlers[j].second.empty()) BSON_APPEND_UTF8(&h, "w", ev.handlers[j].second.c_str());
        bson_append_document_end(&hs, &h);
      }
      bson_append_array_end(&e, &hs);
      if (!ev.dedupe.empty()) BSON_APPEND_UTF8(&e, "d", ev.dedupe.c_str());
    }
    if (!ev.rejected.empty()) BSON_APPEND_UTF8(&e, "r", ev.rejected.c_str());
    if (ev.folded > 0) BSON_APPEND_INT64(&e, "f", ev.folded);
    bson_append_document_end(&arr, &e);
  }
  bson_append_array_end(doc, &arr);
  if (!holds()) return 0;
  if (!store_.insert_version(doc)) {
    // Someone else committed this version: we are not (or no longer) the
    // sequencer. Forget the cache; the next step recovers from what they wrote.
    log_warn("sequencer superseded: version taken by another writer", {{"version", v.v}, {"epoch", epoch_}});
    recovered_ = false;
    return 0;
  }
  crash_point("after_version");
  version_ = v.v;
  next_id_ = v.next_id;
  for (const auto& [k, s] : batch_seqs) key_seqs_[k] = s;
  recovered_ = false;  // until applied: a failure below makes the next step redo this version
  if (!apply(v, holds)) return 0;
  recovered_ = true;
  unread_.erase(unread_.begin(), unread_.begin() + n_take);
  drop_unread.keep = true;
  sequenced_ += docs.size();
  for (const auto& ev : v.events)
    if (!ev.rejected.empty()) log_warn("outbox document rejected", {{"outbox_id", ev.id_json}, {"error", ev.rejected}});
  return static_cast<int>(docs.size());
}

}  // namespace relaybus::mongo
