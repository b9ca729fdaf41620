// The relaybus data model over libmongoc (docs/mongo.md describes it):
//
//   relay_handlers      {_id: name, kind: "http", target, options: JSON text}
//   relay_routes        {_id: "<handler>|<pattern>", pattern, handler, wire_name?}
//   relay_deliveries_<first id>  {_id: delivery id, event_id, handler, lane, key?, seq,
//                        priority, not_before, published_at, attempt, topic, wire_topic?,
//                        payload, headers?, last_error?, last_status?}: one segment
//                        per kSegmentIds ids (segments.cpp); relay_deliveries itself
//                        holds replays and 0.1.0's documents
//   relay_segments      {_id: first id, c0..c3: true}  the segments and their priority classes
//   relay_key_seqs      {_id: key, seq}              (the sequencer's; sequencer.hpp)
//   relay_counters      {_id: "ids", n}              (0.1.0's id counter, read at recovery)
//   relay_outbox, relay_sequence, relay_dedupe, relay_outbox_rejects: outbox.hpp
//   relay_lanes         {_id: "<lane>:<epoch>", lane, epoch, owner, until}
//   relay_instances     {_id: instance, until}
//   relay_dead_letters  a delivery document plus attempts, last_error, last_status, failed_at
//
// The calls are grouped by the documents they touch, a file each (the groups
// below name them); store.cpp has the client and the schema.
//
// Every call that talks to the server counts one command (commands()).
// Errors are thrown as StoreError (code = the server's error code when there
// is one, 11000 for a duplicate key).
#pragma once

#include <mongoc/mongoc.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/handler_config.hpp"

namespace relaybus::mongo {

struct StoreError : std::runtime_error {
  StoreError(const std::string& what, int code_) : std::runtime_error(what), code(code_) {}
  int code;
};

constexpr int kDuplicateKey = 11000;
// Throws StoreError("<what>: <the driver's message>", the server's code).
[[noreturn]] void raise_store_error(const char* what, const bson_error_t& err);

struct HandlerDoc {
  std::string name;
  core::HandlerKind kind = core::HandlerKind::Http;
  std::string target;
  std::string options_json = "{}";
  core::HandlerOptions options;  // parsed (load_handlers)
};

struct RouteDoc {
  std::string pattern;
  std::string handler;
  std::string wire_name;  // empty: none
};

struct Delivery {
  int64_t id = 0;
  int64_t event_id = 0;
  std::string handler;
  int lane = 0;
  bool has_key = false;
  std::string key;
  int64_t seq = 0;
  int priority = 1;
  int64_t not_before_ms = 0;
  int64_t published_ms = 0;
  int attempt = 0;    // failed attempts so far
  std::string topic;  // the wire name when the route had one, else the topic
  std::string payload_json;
  std::string headers_json;  // empty: none
  std::string malformed;     // why the document cannot be delivered; empty = fine
};

// Delivery segments (docs/mongo.md, "Delivery segments"): the sequencer
// writes delivery id i into the collection of segment i / kSegmentIds, and
// drops a segment once it is fully assigned and empty, as PgQ rotates its
// event tables. Every delete, update and windowed read then touches one
// segment, whose size does not grow with the backlog, also on FerretDB v1,
// which scans a whole collection for every delete and update.
constexpr int64_t kSegmentIds = 256;
struct Segment {
  int64_t first_id = -1;   // -1: relay_deliveries itself (replays, 0.1.0's documents)
  unsigned classes = 0xF;  // bit c: it may hold deliveries of priority c
  std::string collection;
};
std::string segment_collection(int64_t first_id);

struct LaneDoc {
  int lane = 0;
  int64_t epoch = 0;
  std::string owner;  // "" = released
  int64_t until_ms = 0;
};

struct Failure {
  int64_t id;
  std::string error;
  int status;
  bool dead;
  int64_t not_before_ms;  // retries
  std::string handler;
};

class Store {
 public:
  Store(const std::string& uri, const std::string& database);  // throws StoreError
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  void ping();
  // Collections and indexes; idempotent. Returns what was created (names).
  std::vector<std::string> init();

  // ---- The catalog (store_catalog.cpp).
  void put_handler(const HandlerDoc& h);     // insert or replace
  bool insert_handler(const HandlerDoc& h);  // false: the name exists already
  bool drop_handler(const std::string& name);
  std::vector<HandlerDoc> load_handlers(std::vector<std::string>* bad);  // bad: "name: why"
  void put_route(const RouteDoc& r);
  bool drop_route(const std::string& pattern, const std::string& handler);
  std::vector<RouteDoc> load_routes();

  // ---- Lane leases and instances (store_lanes.cpp).
  std::vector<LaneDoc> read_lanes();
  // Inserts lane documents; result[i] = true if docs[i] was inserted, false on
  // a duplicate key (someone else holds that epoch). One command.
  std::vector<bool> insert_lanes(const std::vector<LaneDoc>& docs);
  void delete_lane_docs(const std::vector<std::pair<int, int64_t>>& lane_epochs);  // one command
  // An instance's load per handler, written with its heartbeat so that
  // `stats` can sum the live instances' in-flight counts and latencies.
  struct HandlerLoad {
    int64_t in_flight = 0;
    std::vector<int64_t> latency_buckets;  // cumulative, Metrics::kBucketsS
    int64_t latency_count = 0;
    double latency_sum_s = 0;
    int64_t held_back = 0;  // deliveries that waited for a max_concurrency or rate permit
    bool limited = false;   // one waited within the last second
  };
  void heartbeat_load(const std::string& instance, int64_t until_ms, const std::map<std::string, HandlerLoad>& load);
  void remove_instance(const std::string& instance);
  int live_instances(int64_t now_ms);
  // The same, and *rank: how many of them sort before `instance` by name.
  int live_instances(int64_t now_ms, const std::string& instance, int* rank);
  std::map<std::string, HandlerLoad> live_load(int64_t now_ms);  // summed over live instances

  // ---- Deliveries (store_deliveries.cpp).
  std::vector<Delivery> fetch_window(const std::string& handler, const std::vector<int>& lanes, int limit);
  // The handler's deliveries of one priority class in the lanes, oldest
  // first (one find): with one per class, the planner sees the head of every
  // class however deep the backlog is.
  std::vector<Delivery> fetch_class_window(const std::string& handler, const std::vector<int>& lanes, int priority,
                                           int limit);
  // Deliveries of `handler` with one of the keys at a seq below the given one
  // (the fence when a window was cut short): returns the keys of the rows found.
  std::vector<std::string> earlier_keys(const std::string& handler,
                                        const std::vector<std::pair<std::string, int64_t>>& key_seqs);
  int64_t complete(const std::vector<int64_t>& ids);  // one deleteMany per segment
  // Retries: one bulk of updates. Dead letters: one insert + one delete.
  void fail(const std::vector<Failure>& failures, int64_t now_ms);

  // ---- Dead letters (store_dead_letters.cpp).
  int64_t replay(const std::string& handler, const std::vector<int64_t>& ids, int64_t now_ms);
  // Moves every delivery of `handler` into relay_dead_letters with `reason`
  // (batches of 1000: find, insert, delete) and marks all of the handler's
  // dead letters dropped (`handler_dropped_at`), so that neither a recreated
  // handler nor `replay` revives them. Returns how many deliveries moved.
  int64_t dead_letter_handler(const std::string& handler, const std::string& reason, int64_t now_ms);

  // ---- Counts (store_stats.cpp), the PostgreSQL views' columns: `stats`,
  // /metrics and `handler drop`.
  struct Backlog {
    int64_t pending = 0;
    int64_t ready = 0;      // not_before passed (in flight ones included)
    int64_t delayed = 0;    // not_before ahead: scheduled or in backoff
    int64_t retrying = 0;   // attempt > 0
    int64_t dead = 0;       // dead letters (not of a dropped handler)
    int64_t oldest_ms = 0;  // published_at of the oldest pending, 0 = none
  };
  Backlog backlog(const std::string& handler, int64_t now_ms);  // 5 counts + 1 find
  int64_t count_pending(const std::string& handler);

  // ---- The outbox and its sequencer (outbox_store.cpp; docs/mongo.md, "The outbox").
  // Applications insert into relay_outbox; only the sequencer reads it.
  void insert_outbox(const bson_t* doc);  // one insert (the CLI's publish)
  // One ordered insertMany (publish --batch): the documents in the given order.
  void insert_outbox_many(const std::vector<const bson_t*>& docs);
  // The outbox head in _id order (owned copies). MongoDB: up to `limit`
  // documents. FerretDB: the whole outbox, one snapshot, up to
  // kOutboxSnapshotDocs / kOutboxSnapshotBytes of its smallest _ids (outbox_order.hpp).
  std::vector<std::shared_ptr<bson_t>> read_outbox(int limit);
  // Outbox documents by _id (the values of ids[i]'s "_id" field).
  std::vector<std::shared_ptr<bson_t>> read_outbox_ids(const std::vector<const bson_t*>& ids);
  // relay_sequence: the highest version document (owned), or null.
  std::shared_ptr<bson_t> read_top_version();
  // Segment reads stop below the sequencer's relay_counters "inserted_below"
  // (every delivery id below it is inserted): read (one find) and applied to
  // every later window read (fetch_window, fetch_class_window) until the next
  // call; never called, or no such document: no bound. The dispatcher and the
  // pull API call it before each round of window reads (docs/mongo.md,
  // "Delivery segments").
  void read_inserted_bound();
  // The sequencer: every delivery id below next_id is inserted ($max, upsert).
  void raise_inserted_below(int64_t next_id);
  // Inserts a version document; false if its _id exists (another writer got there first).
  bool insert_version(const bson_t* doc);
  void delete_versions_below(int64_t version);
  int64_t read_id_counter();  // relay_counters "ids" (0.1.0 publishes), 0 if none
  std::map<std::string, int64_t> read_key_seqs(const std::vector<std::string>& keys);
  void raise_key_seqs(const std::map<std::string, int64_t>& seqs);                   // $max, upsert; one bulk
  std::map<std::string, int64_t> read_dedupe(const std::vector<std::string>& keys);  // key -> event id
  // insertMany (unordered) into `collection`; duplicate keys count as done.
  void insert_idempotent(const char* collection, const std::vector<bson_t*>& docs, const char* what);
  // One deleteMany {_id: {$in: <ids[i]'s _id>...}} (FerretDB v1 scans the
  // collection once per delete statement, whatever its filter).
  int64_t delete_ids(const char* collection, const std::vector<const bson_t*>& ids, const char* what);
  int64_t count_outbox();
  // FerretDB (buildInfo has ferretdbVersion): it evaluates filters and sorts in
  // Go over whole collections, but stops early at a limit without a sort. Asked once.
  bool is_ferretdb();
  // A read without a sort returns a collection's rows in insertion order, and
  // an update leaves its row there: FerretDB on its SQLite backend, named in
  // getLog's startupWarnings. Not on its PostgreSQL backend (an update writes
  // a new row version wherever there is room), nor while FerretDB names no
  // backend yet. Asked once.
  bool keeps_insertion_order();
  // ---- Delivery segments (segments.cpp).
  // The sequencer, before it inserts deliveries: each segment they fall in
  // is recorded in relay_segments with their priority classes (and gets its
  // indexes) first, so that no reader misses it.
  void prepare_segments(const std::map<int64_t, unsigned>& classes_by_first_id);
  // Inserts deliveries (each doc's int64 _id picks its segment); duplicates count as done.
  void insert_deliveries(const std::vector<bson_t*>& docs);
  // The sequencer: drops segments that lie wholly below `assigned_below`
  // (every id in them was inserted) and hold no delivery. Returns how many.
  int drop_drained_segments(int64_t assigned_below);
  // relay_deliveries and every segment, oldest first (reads relay_segments
  // again when the list in hand is older than max_age_ms).
  const std::vector<Segment>& delivery_collections(int64_t max_age_ms = 1000);

  uint64_t commands() const { return commands_; }
  const std::map<std::string, uint64_t>& command_counts() const { return by_op_; }
  // Brackets every command, on the calling thread: the dispatcher lets helper
  // threads drive its HTTP requests and renew its lane leases while the
  // command runs (command_window.hpp). begin(lanes): `lanes` says the command
  // writes lane leases itself (a renewal must not race it). Commands nested
  // in one method share the outer bracket. Neither may call the store.
  struct CommandObserver {
    virtual void begin(bool lanes) = 0;
    virtual void end() noexcept = 0;

   protected:
    ~CommandObserver() = default;
  };
  void set_observer(CommandObserver* o) { observer_ = o; }

 private:
  // {_id: {$in: [the _id of each of `docs`]}} into `filter` (outbox_store.cpp).
  static void append_id_in(bson_t* filter, const std::vector<const bson_t*>& docs);
  int64_t count_all(const char* collection, const char* what);
  // insertOne (one command); false: a document with its _id exists already.
  bool insert_new(const char* collection, const bson_t* doc, const char* what);
  // deleteOne {_id: id} (one command): how many were deleted (0 or 1).
  int64_t delete_id(const char* collection, const std::string& id, const char* what);
  // Every document of `collection` (one find) to f (store_docs.hpp).
  template <typename F>
  void each_in(const char* collection, const char* what, F&& f);
  bool read_counter(const char* id, int64_t* n);  // relay_counters {_id: id}.n; false: none
  // One find of the handler's deliveries in the lanes (of one priority class
  // when `priority` is set), oldest first; `what` names it in errors.
  std::vector<Delivery> find_deliveries(const std::string& handler, const std::vector<int>& lanes, const int* priority,
                                        int limit, const char* what);

  mongoc_collection_t* coll(const char* name);
  // Ends the observer's bracket when the command's method is done with it.
  class CommandScope {
   public:
    explicit CommandScope(Store* s) : s_(s) {}
    CommandScope(const CommandScope&) = delete;
    CommandScope& operator=(const CommandScope&) = delete;
    ~CommandScope() {
      if (s_ != nullptr && --s_->depth_ == 0 && s_->observer_ != nullptr) s_->observer_->end();
    }

   private:
    Store* s_;
  };
  // Counts a command about to be sent and opens the observer's bracket.
  [[nodiscard]] CommandScope count(const char* op, bool lanes = false) {
    commands_++;
    by_op_[op]++;
    if (depth_++ == 0 && observer_ != nullptr) observer_->begin(lanes);
    return CommandScope(this);
  }

  mongoc_client_t* client_ = nullptr;
  std::string db_;
  std::map<std::string, mongoc_collection_t*> colls_;
  uint64_t commands_ = 0;
  std::map<std::string, uint64_t> by_op_;
  CommandObserver* observer_ = nullptr;
  int depth_ = 0;             // commands in progress (nested: one bracket)
  int ferretdb_ = -1;         // unknown until is_ferretdb()
  int insertion_order_ = -1;  // unknown until keeps_insertion_order()
  // Segments (segments.cpp).
  std::vector<Segment> segments_;  // relay_deliveries first
  int64_t segments_read_ms_ = -1;
  std::set<int64_t> prepared_;          // segments this process recorded
  std::set<int64_t> base_ids_;          // delivery ids read from relay_deliveries itself
  int64_t inserted_bound_ = INT64_MAX;  // read_inserted_bound: highest segment id a window reads
  // The collection that holds delivery `id`: relay_deliveries for ids read
  // from there, else its segment's.
  mongoc_collection_t* delivery_coll(int64_t id);
  int64_t delete_deliveries(mongoc_collection_t* c, const std::vector<int64_t>& ids);  // one deleteMany
  int64_t count_deliveries_where(const bson_t* filter);     // summed over every delivery collection
  int64_t oldest_published_ms(const std::string& handler);  // 0: none pending
  // ids grouped by delivery_coll, oldest collection first.
  std::vector<std::pair<mongoc_collection_t*, std::vector<int64_t>>> by_collection(const std::vector<int64_t>& ids);
  // Reads deliveries of `filter` from the collections in order until `limit`
  // rows (0: no limit), segments of `priority`'s class only when it is set.
  std::vector<Delivery> find_in_segments(const bson_t* filter, const std::string& handler, const int* priority,
                                         int limit, bool sorted, const char* what);
};

}  // namespace relaybus::mongo
