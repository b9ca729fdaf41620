// relaybus and the floor as systems under test.

#include "systems.hpp"

#include <sys/stat.h>

#include "receiver.hpp"

#include <functional>
#include <map>
#include <stdexcept>

namespace bench {

std::string sql_payload_expr(const std::string& i) {
  // The same fields as make_payload(); jsonb normalizes the text either way.
  return "pg_catalog.jsonb_build_object('order', 10000000 + (" + i +
         ") % 90000000, 'amount', 1999, "
         "'cur', 'EUR', 'cust', 'c-123456', 'note', 'abcdefghij', "
         "'t', (extract(epoch FROM pg_catalog.clock_timestamp()) * 1e9)::int8)";
}

std::string sql_key_expr(Keys k, const std::string& i) {
  int n = keys_count(k);
  if (n == 0) return "NULL::text";
  return "'k' || ((pg_catalog.hashint4((" + i + ")::int4)::int8 & 2147483647) % " + std::to_string(n) + ")";
}

static uint32_t seed_of(const Cell& c, int i) {
  return uint32_t(std::hash<std::string>()(c.name) & 0x7fffffff) + uint32_t(i) * 7919u + 1u;
}

// Publisher process i of a cell: its sql takes ($1 payload, $2 key) for batch 1, or
// ($1 payloads[], $2 keys[]) for batches; the caller adds pacing and id recording.
static ChildSpec publisher(const Cell& c, int i, const std::string& conninfo, int batch, std::string sql) {
  ChildSpec s;
  s.role = Role::Publish;
  s.label = "pub-" + std::to_string(i);
  s.conninfo = conninfo;
  s.batch = batch;
  s.sql = std::move(sql);
  s.keys = c.keys;
  s.seed = seed_of(c, i);
  return s;
}

// The http cells' handler secret (requests are signed, as in production).
static const char* kHttpSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

static int handler_index_of(const std::string& name) {
  // "bench_h<N>"
  size_t p = name.rfind('h');
  return p == std::string::npos ? 0 : atoi(name.c_str() + p + 1);
}

// The child that reads the receiver's access log (with_map: receipts for the exactness check).
static ChildSpec http_log_child(const std::string& conninfo, bool with_map) {
  ChildSpec s;
  s.role = Role::HttpLog;
  s.label = "nginx-log";
  s.conninfo = conninfo;
  s.http_log = http_receiver().log_path();
  s.nginx_pid = http_receiver().pid();
  if (with_map)
    s.map_sql =
        "SELECT d.id, d.event_id, d.key, d.seq, h.name FROM relay.deliveries d"
        " JOIN relay.handlers h ON h.id = d.handler_id";
  return s;
}

// ---- relaybus -------------------------------------------------------------------

class Relaybus : public System {
 public:
  std::string name() const override { return "relaybus"; }

  void install(Conn& setup) override { setup.exec("CREATE EXTENSION IF NOT EXISTS relaybus"); }

  std::vector<std::string> tables(const Cell&) const override {
    return {"relay.deliveries", "relay.key_seqs", "relay.dead_letters"};
  }
  std::string main_table(const Cell&) const override { return "relay.deliveries"; }

  void prepare(Conn& setup, Conn& admin, const Cell& c) override {
    setup.exec("TRUNCATE relay.deliveries, relay.key_seqs, relay.dead_letters");
    setup.exec("DELETE FROM relay.routes");
    setup.exec("DELETE FROM relay.handlers");
    std::string kind = "pull", opts = "{}";
    if (c.variant == "notify-fire" || c.group == Group::Mixed) kind = "notify";
    if (c.variant == "notify-ack") {
      kind = "notify";
      opts = "{\"ack\": true}";
    }
    if (c.variant == "http") {
      kind = "http";
      opts = strf("{\"secret\": \"%s\", \"concurrency\": %d}", kHttpSecret, c.concurrency);
      http_receiver().truncate_log();
      admin.exec("ALTER SYSTEM SET relaybus.http_allowlist = '127.0.0.1'");
    }
    for (int i = 0; i < c.handlers; i++) {
      std::string h = "bench_h" + std::to_string(i);
      std::string target = kind == "notify" ? sql_lit(h) : (kind == "http" ? sql_lit(http_receiver().url()) : "NULL");
      setup.exec("SELECT relay_create_handler(" + sql_lit(h) + ", " + sql_lit(kind) + ", " + target + ", " +
                 sql_lit(opts) + "::jsonb)");
      setup.exec("SELECT relay_route('bench.e', " + sql_lit(h) + ")");
    }
    // Notify cells start their dispatchers only when the listeners are there
    // (a notification nobody listens to is gone, and fire mode deletes on send);
    // http cells when the backlog is loaded, so the window sees a steady state.
    bool notify = kind == "notify" || kind == "http";
    int n = c.dispatchers > 0 ? c.dispatchers : 1;
    set_dispatchers(admin, !notify, n, c.batch_size);
  }

  std::vector<std::string> preload_sql(const Cell& c, long long deliveries, bool* parallel) override {
    // Keyed batches lock their keys until commit, so two at once would only queue.
    *parallel = c.keys == Keys::None;
    std::vector<std::string> out;
    long long events = (deliveries + c.handlers - 1) / c.handlers;
    const long long chunk = 10000;  // relay_publish_batch's maximum
    for (long long from = 1; from <= events; from += chunk) {
      long long to = std::min(events, from + chunk - 1);
      out.push_back(
          strf("SELECT pg_catalog.array_length(relay_publish_batch('bench.e', s.p, s.k), 1) FROM ("
               " SELECT array_agg(%s ORDER BY i) AS p, array_agg(%s ORDER BY i) AS k"
               " FROM generate_series(%lld, %lld) AS i) s",
               sql_payload_expr("i").c_str(), sql_key_expr(c.keys, "i").c_str(), from, to));
    }
    return out;
  }

  std::vector<ChildSpec> children(const Cell& c, const std::string& conninfo) override {
    std::vector<ChildSpec> out;
    auto publishers = [&](double rate_each, bool record) {
      for (int i = 0; i < c.publishers; i++) {
        int batch = c.group == Group::Mixed ? 1 : c.batch;
        ChildSpec s = publisher(c, i, conninfo, batch,
                                batch == 1 ? "SELECT relay_publish('bench.e', $1::jsonb, $2)"
                                           : "SELECT relay_publish_batch('bench.e', $1::jsonb[], $2::text[])");
        s.rate = rate_each;
        s.returns_ids = true;
        s.record_pubs = record;
        out.push_back(s);
      }
    };
    auto listeners = [&](bool ack) {
      for (int h = 0; h < c.handlers; h++) {
        ChildSpec s;
        s.role = Role::Listen;
        s.label = "listen-" + std::to_string(h);
        s.conninfo = conninfo;
        s.channels = {"bench_h" + std::to_string(h)};
        s.handler_index = h;
        // Only a lease's holder completes: the message's lease goes with its id.
        if (ack) s.ack_sql = "SELECT relay_ack($1::bigint[], $2::uuid[])";
        out.push_back(s);
      }
    };
    if (c.group == Group::Publish) {
      publishers(0, false);
    } else if (c.group == Group::Mixed) {
      publishers(double(c.rate) / c.publishers, true);
      listeners(false);
    } else if (c.variant == "http") {
      out.push_back(http_log_child(conninfo, true));
    } else if (c.variant == "pull") {
      for (int i = 0; i < c.consumers; i++) {
        ChildSpec s;
        s.role = Role::ClaimAck;
        s.label = "claim-" + std::to_string(i);
        s.conninfo = conninfo;
        s.handler_index = i % c.handlers;
        s.claim_sql = strf("SELECT id, event_id, key, seq, payload FROM relay_claim('bench_h%d', %d, NULL, %d)",
                           s.handler_index, c.batch, c.per_key);
        s.ack_sql = "SELECT relay_ack($1::bigint[])";
        out.push_back(s);
      }
    } else {
      listeners(c.variant == "notify-ack");
    }
    return out;
  }

  static bool in_server(const Cell& c) {
    return c.variant == "notify-fire" || c.variant == "notify-ack" || c.variant == "http" || c.group == Group::Mixed;
  }
  void start_delivery(Conn& admin, const Cell& c) override {
    if (in_server(c)) set_dispatchers(admin, true, c.dispatchers > 0 ? c.dispatchers : 1, c.batch_size);
  }
  void stop_delivery(Conn& admin, const Cell& c) override {
    if (!in_server(c)) return;
    try {
      set_dispatchers(admin, false, c.dispatchers > 0 ? c.dispatchers : 1, c.batch_size, 15);
    } catch (const std::exception& e) {
      // A dispatcher inside a long iteration checks relaybus.enabled only between
      // iterations: cancel its statement so the next samples do not run beside it.
      admin.exec("SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE backend_type = 'relaybus dispatcher'");
      try {
        set_dispatchers(admin, false, 1, c.batch_size, 20);
      } catch (...) {
      }
      throw std::runtime_error(std::string(e.what()) + "; its statement was cancelled");
    }
  }

  long long backlog(Conn& admin, const Cell&) override {
    return admin.one_i64("SELECT count(*) FROM relay.deliveries");
  }

  std::vector<int> server_pids(Conn& admin) override {
    Result r = admin.exec(
        "SELECT pid FROM pg_stat_activity WHERE backend_type = 'relaybus dispatcher'"
        " AND datname = current_database() ORDER BY pid");
    std::vector<int> pids;
    for (int i = 0; i < r.rows(); i++) pids.push_back(int(r.i64(i, 0)));
    return pids;
  }

  Json sample_stats(Conn& admin, const Cell& c) override {
    if (c.group == Group::Publish) return Json();
    Json j = Json::array();
    Result r = admin.exec(
        "SELECT handler, delivered, retried, latency_p50_ms, latency_p99_ms FROM relay.handler_stats"
        " ORDER BY handler");
    for (int i = 0; i < r.rows(); i++) {
      Json h = Json::object();
      h["handler"] = r.str(i, 0);
      h["delivered"] = r.i64(i, 1);
      h["retried"] = r.i64(i, 2);
      if (!r.null(i, 3)) h["dispatcher_latency_p50_ms"] = r.f64(i, 3);
      if (!r.null(i, 4)) h["dispatcher_latency_p99_ms"] = r.f64(i, 4);
      j.push(h);
    }
    Json w = Json::array();
    Result wr =
        admin.exec("SELECT pid, worker, lanes_held, delivered, failed, last_error FROM relay.workers ORDER BY worker");
    for (int i = 0; i < wr.rows(); i++) {
      Json x = Json::object();
      x["pid"] = wr.i64(i, 0);
      x["worker"] = wr.i64(i, 1);
      x["lanes_held"] = wr.i64(i, 2);
      x["delivered"] = wr.i64(i, 3);
      x["failed"] = wr.i64(i, 4);
      x["last_error"] = wr.str(i, 5);
      w.push(x);
    }
    Json out = Json::object();
    out["handler_stats"] = j;
    out["workers"] = w;
    return out;
  }

  Json settings(Conn& admin) override {
    Json j = Json::object();
    Result r = admin.exec("SELECT name, setting FROM pg_settings WHERE name LIKE 'relaybus.%' ORDER BY name");
    for (int i = 0; i < r.rows(); i++) j[r.str(i, 0)] = r.str(i, 1);
    return j;
  }

  bool checks_exactness(const Cell& c) const override { return c.group != Group::Publish; }

  void expected(Conn& setup, const Cell&, std::vector<uint64_t>* ids) override {
    Result r =
        setup.exec("SELECT d.event_id, h.name FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id");
    ids->reserve(size_t(r.rows()));
    for (int i = 0; i < r.rows(); i++) ids->push_back(ident(r.i64(i, 0), handler_index_of(r.str(i, 1))));
  }

  void pending(Conn& setup, const Cell&, std::vector<PendingRow>* rows) override {
    Result r = setup.exec(
        "SELECT d.event_id, h.name, d.key, d.seq FROM relay.deliveries d"
        " JOIN relay.handlers h ON h.id = d.handler_id");
    rows->reserve(size_t(r.rows()));
    for (int i = 0; i < r.rows(); i++)
      rows->push_back(PendingRow{ident(r.i64(i, 0), handler_index_of(r.str(i, 1))),
                                 r.null(i, 2) ? -1 : key_id_of(r.val(i, 2)), r.null(i, 3) ? -1 : r.i64(i, 3)});
  }

  void dead(Conn& setup, const Cell&, std::vector<uint64_t>* ids) override {
    Result r = setup.exec("SELECT event_id, handler FROM relay.dead_letters");
    for (int i = 0; i < r.rows(); i++) ids->push_back(ident(r.i64(i, 0), handler_index_of(r.str(i, 1))));
  }

  std::string inject_loss(Conn& admin, const Cell&) override {
    Result r = admin.exec(
        "DELETE FROM relay.deliveries WHERE id = (SELECT max(id) FROM relay.deliveries)"
        " RETURNING id, event_id");
    if (r.rows() == 0) return "nothing to delete";
    return "deleted delivery " + r.str(0, 0) + " (event " + r.str(0, 1) + ")";
  }

 private:
  // relaybus.enabled / workers_per_database / batch_size through ALTER SYSTEM and a
  // reload; waits until relay.workers shows the dispatchers holding all 64 lanes
  // (or none running when disabled).
  void set_dispatchers(Conn& admin, bool enabled, int n, int batch_size, int timeout_s = 30) {
    admin.exec(std::string("ALTER SYSTEM SET relaybus.enabled = ") + (enabled ? "on" : "off"));
    admin.exec(strf("ALTER SYSTEM SET relaybus.workers_per_database = %d", n));
    admin.exec(strf("ALTER SYSTEM SET relaybus.batch_size = %d", batch_size));
    admin.exec("SELECT pg_reload_conf()");
    int64_t deadline = mono_ns() + int64_t(timeout_s) * 1000000000LL;
    std::string last;
    while (mono_ns() < deadline) {
      Result r = admin.exec(
          "SELECT (SELECT count(*) FROM relay.workers), (SELECT coalesce(sum(lanes_held), 0) FROM relay.workers),"
          " (SELECT coalesce(min(lanes_held), 0) FROM relay.workers),"
          " (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'relaybus dispatcher'"
          "   AND datname = current_database())");
      long long cnt = r.i64(0, 0), sum = r.i64(0, 1), mn = r.i64(0, 2), procs = r.i64(0, 3);
      last = strf("workers=%lld lanes=%lld min=%lld processes=%lld", cnt, sum, mn, procs);
      if (!enabled && cnt == 0 && procs == 0) return;
      if (enabled && cnt == n && procs == n && sum == 64 && mn * n >= 64 - n) return;
      sleep_ms(50);
    }
    throw std::runtime_error(strf("relaybus dispatchers did not reach enabled=%d n=%d within %d s (%s)", enabled, n,
                                  timeout_s, last.c_str()));
  }
};

// ---- the floor: the same rows in plain tables, nothing else ---------------------

class Floor : public System {
 public:
  std::string name() const override { return "floor"; }

  void install(Conn& setup) override {
    setup.exec("CREATE TABLE IF NOT EXISTS floor_events (id bigserial PRIMARY KEY, key text, payload jsonb NOT NULL)");
    setup.exec("CREATE TABLE IF NOT EXISTS floor_backlog (id bigserial PRIMARY KEY, key text, payload jsonb NOT NULL)");
    setup.exec("CREATE TABLE IF NOT EXISTS floor_done (id bigint NOT NULL, done_at timestamptz NOT NULL)");
  }

  std::vector<std::string> tables(const Cell& c) const override {
    if (c.group != Group::Dispatch) return {"public.floor_events"};
    return {"public.floor_backlog", "public.floor_done"};
  }
  std::string main_table(const Cell& c) const override {
    return c.group != Group::Dispatch ? "public.floor_events" : "public.floor_backlog";
  }

  void prepare(Conn& setup, Conn&, const Cell& c) override {
    setup.exec("TRUNCATE floor_events, floor_backlog, floor_done RESTART IDENTITY");
    if (c.variant == "wrk") {
      NginxReceiver& rx = http_receiver();
      rx.truncate_log();
      // The request relaybus sends: the same envelope (built by the same SQL as the
      // dispatcher's, ids of a realistic width) and the same headers.
      std::string body = setup.one(
          "SELECT pg_catalog.jsonb_build_object('id', 1234567, 'event_id', 1234567, 'topic', 'bench.e',"
          " 'key', NULL::text, 'seq', NULL::int8, 'attempt', 1, 'headers', NULL::jsonb, 'payload', " +
          sql_payload_expr("1") + ")::text");
      std::string lua =
          "wrk.method = \"POST\"\n"
          "wrk.body = [==[" +
          body +
          "]==]\n"
          "wrk.headers[\"content-type\"] = \"application/json\"\n"
          "wrk.headers[\"user-agent\"] = \"relaybus/0.1.0\"\n"
          "wrk.headers[\"accept\"] = \"*/*\"\n"
          "wrk.headers[\"webhook-id\"] = \"1234567\"\n"
          "wrk.headers[\"webhook-timestamp\"] = \"" +
          std::to_string(real_ns() / 1000000000) +
          "\"\n"
          "wrk.headers[\"webhook-signature\"] = \"v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDDkkHvH8=\"\n";
      write_file(wrk_script(), lua);
    }
  }

  std::vector<std::string> preload_sql(const Cell& c, long long deliveries, bool* parallel) override {
    *parallel = true;
    std::vector<std::string> out;
    if (c.variant == "notify" || c.variant == "wrk") return out;  // nothing to take from
    const long long chunk = 50000;
    for (long long from = 1; from <= deliveries; from += chunk) {
      long long to = std::min(deliveries, from + chunk - 1);
      out.push_back(strf("INSERT INTO floor_backlog (key, payload) SELECT %s, %s FROM generate_series(%lld, %lld) AS i",
                         sql_key_expr(c.keys, "i").c_str(), sql_payload_expr("i").c_str(), from, to));
    }
    return out;
  }

  std::vector<ChildSpec> children(const Cell& c, const std::string& conninfo) override {
    std::vector<ChildSpec> out;
    // The minimum to hand rows over and remove them: no row locks (FOR UPDATE would write a
    // WAL record per row); several processes take disjoint rows (id modulo the process count).
    auto take_for = [&](int i) {
      std::string part = c.consumers > 1 ? strf(" WHERE id %% %d = %d", c.consumers, i) : "";
      return strf(
          "DELETE FROM floor_backlog WHERE id IN (SELECT id FROM floor_backlog%s ORDER BY id LIMIT %d)"
          " RETURNING id, key, payload",
          part.c_str(), c.batch);
    };
    if (c.group == Group::Mixed) {
      // Latency floor: INSERT + pg_notify in the publisher's own transaction, paced
      // like the relaybus publishers, the payload shaped like relaybus's.
      for (int i = 0; i < c.publishers; i++) {
        ChildSpec s = publisher(
            c, i, conninfo, 1,
            "WITH e AS (INSERT INTO floor_events (key, payload) VALUES ($2, $1::jsonb) RETURNING id, key, payload)"
            " SELECT e.id FROM e, LATERAL pg_notify('floor_ch', pg_catalog.jsonb_build_object('id', e.id,"
            " 'event_id', e.id, 'topic', 'bench.e', 'key', e.key, 'seq', NULL, 'attempt', 1,"
            " 'headers', NULL, 'payload', e.payload)::text) AS n");
        s.rate = double(c.rate) / c.publishers;
        s.returns_ids = true;
        s.record_pubs = true;
        out.push_back(s);
      }
      ChildSpec l;
      l.role = Role::Listen;
      l.label = "listen-0";
      l.conninfo = conninfo;
      l.channels = {"floor_ch"};
      out.push_back(l);
    } else if (c.group == Group::Publish) {
      for (int i = 0; i < c.publishers; i++) {
        std::string times = c.handlers > 1 ? strf(" CROSS JOIN generate_series(1, %d)", c.handlers) : "";
        std::string sql;
        if (c.batch == 1)
          sql = c.handlers > 1
                    ? "INSERT INTO floor_events (key, payload) SELECT $2, $1::jsonb FROM generate_series(1, " +
                          std::to_string(c.handlers) + ")"
                    : "INSERT INTO floor_events (key, payload) VALUES ($2, $1::jsonb)";
        else
          sql =
              "INSERT INTO floor_events (key, payload) SELECT u.k, u.p FROM unnest($1::jsonb[], $2::text[]) AS u(p, k)" +
              times;
        out.push_back(publisher(c, i, conninfo, c.batch, sql));
      }
    } else if (c.variant == "wrk") {
      out.push_back(http_log_child(conninfo, false));
      ChildSpec w;
      w.role = Role::Exec;
      w.label = "wrk";
      w.conninfo = conninfo;
      w.argv = {"wrk",
                strf("-t%d", c.concurrency < 2 ? 1 : 2),
                strf("-c%d", c.concurrency),
                "-d{secs}s",
                "-s",
                wrk_script(),
                http_receiver().url()};
      out.push_back(w);
    } else if (c.variant == "delete" || c.variant == "delete+insert") {
      for (int i = 0; i < c.consumers; i++) {
        ChildSpec s;
        s.role = Role::Take;
        s.label = "take-" + std::to_string(i);
        s.conninfo = conninfo;
        std::string take = take_for(i);
        s.sql = c.variant == "delete" ? take
                                      : "WITH d AS (" + take +
                                            "), c AS (INSERT INTO floor_done (id, done_at) SELECT id, now() FROM d)"
                                            " SELECT id, key, payload FROM d";
        out.push_back(s);
      }
    } else {  // "notify" (bare pg_notify of the same payloads) or "delete+notify"
      ChildSpec l;
      l.role = Role::Listen;
      l.label = "listen-0";
      l.conninfo = conninfo;
      l.channels = {"floor_ch"};
      out.push_back(l);
      for (int i = 0; i < c.consumers; i++) {
        ChildSpec s;
        s.role = Role::NotifySend;
        s.label = "send-" + std::to_string(i);
        s.conninfo = conninfo;
        s.batch = c.batch;
        s.seed = uint32_t(i + 1);
        if (c.variant == "notify") {
          s.send_payloads = true;
          s.sql = "SELECT count(pg_notify('floor_ch', p)) FROM unnest($1::text[]) AS p";
        } else {
          s.sql = "WITH d AS (" + take_for(i) +
                  ") SELECT count(pg_notify('floor_ch', pg_catalog.jsonb_build_object('id', d.id,"
                  " 'event_id', d.id, 'topic', 'bench.e', 'key', d.key, 'seq', NULL, 'attempt', 1,"
                  " 'headers', NULL, 'payload', d.payload)::text)) FROM d";
        }
        out.push_back(s);
      }
    }
    return out;
  }

  long long backlog(Conn& admin, const Cell& c) override {
    if (c.group == Group::Publish) return admin.one_i64("SELECT count(*) FROM floor_events");
    if (c.variant == "notify" || c.variant == "wrk") return -1;  // bare pg_notify, the mixed floor, wrk
    return admin.one_i64("SELECT count(*) FROM floor_backlog");
  }

 private:
  static std::string wrk_script() { return http_receiver().log_path() + ".wrk.lua"; }
};

// ---- peers ------------------------------------------------------------------------

static std::map<std::string, std::string> parse_conninfo(const std::string& conninfo) {
  std::map<std::string, std::string> kv;
  for (const std::string& part : split(conninfo, ' ')) {
    size_t eq = part.find('=');
    if (eq != std::string::npos) kv[part.substr(0, eq)] = part.substr(eq + 1);
  }
  return kv;
}

std::string conninfo_url(const std::string& conninfo) {
  auto kv = parse_conninfo(conninfo);
  // node-postgres (pg-connection-string) takes a unix socket directory as ?host=.
  return "postgresql://" + kv["user"] + "@localhost:" + kv["port"] + "/" + kv["dbname"] + "?host=" + kv["host"] +
         "&application_name=" + (kv.count("application_name") ? kv["application_name"] : "bench");
}

// PgQ (postgresql-15-pgq3, the Skytools queue): events go into rotating event tables
// with pgq.insert_event; a ticker (pgqd, or pgq.ticker()) cuts them into batches by
// transaction snapshots; a consumer reads one batch per transaction with next_batch /
// get_batch_events / finish_batch. Every consumer registered on a queue reads every
// event (fan-out), there are no keys and no per-key order.
class Pgq : public System {
 public:
  explicit Pgq(std::string work_dir) : work_(std::move(work_dir)) {}
  std::string name() const override { return "pgq"; }

  void install(Conn& setup) override {
    setup.exec("CREATE EXTENSION IF NOT EXISTS pgq");
    version_ = setup.one("SELECT pgq.version()");
    // pgqd, the ticker daemon, runs beside the workload in every PgQ sample. ticker_period
    // 0.1 s (default 1 s) so that a tick is never the bottleneck: pgq.ticker() then cuts a
    // batch as soon as ticker_max_count events are waiting.
    mkdir(work_.c_str(), 0755);
    std::string host = PQhost(setup.raw()), port = PQport(setup.raw());
    ini_ = work_ + "/pgqd.ini";
    write_file(ini_,
               "[pgqd]\n"
               "logfile = " +
                   work_ +
                   "/pgqd.log\n"
                   "pidfile = " +
                   work_ +
                   "/pgqd.pid\n"
                   "base_connstr = host=" +
                   host + " port=" + port +
                   " user=postgres application_name=pgqd\n"
                   "initial_database = bench\n"
                   "database_list = bench\n"
                   "ticker_period = 0.1\n");
  }

  std::vector<std::string> tables(const Cell&) const override { return {table_, "pgq.tick", "pgq.subscription"}; }
  std::string main_table(const Cell&) const override { return table_; }
  int rows_per_event(const Cell&) const override { return 1; }
  bool pgstat_counts_units(const Cell& c) const override { return c.group != Group::Dispatch; }

  void prepare(Conn& setup, Conn&, const Cell& c) override {
    setup.exec("SELECT pgq.drop_queue(queue_name, true) FROM pgq.queue WHERE queue_name = 'bench_q'");
    setup.exec("SELECT pgq.create_queue('bench_q')");
    // A batch holds up to ticker_max_count events (default 500); the dispatch cells vary it.
    max_count_ = c.group == Group::Dispatch ? c.batch : 500;
    setup.exec(strf("SELECT pgq.set_queue_config('bench_q', 'ticker_max_count', '%d')", max_count_));
    if (c.group == Group::Dispatch) setup.exec("SELECT pgq.register_consumer('bench_q', 'bench_c')");
    Result r = setup.exec(
        "SELECT queue_id, queue_data_pfx || '_' || queue_cur_table, queue_event_seq FROM pgq.queue"
        " WHERE queue_name = 'bench_q'");
    queue_id_ = r.i64(0, 0);
    table_ = r.str(0, 1);
    event_seq_ = r.str(0, 2);
  }

  // Chunks of ticker_max_count events, each followed by pgq.ticker('bench_q'): the
  // ticker sees ticker_max_count new events and ticks, so every batch holds exactly
  // that many, as a ticker keeping up with a busy queue cuts them. The chunks insert
  // the rows pgq.insert_event writes (id from the queue's event sequence, ev_txid by
  // default) straight into the current event table: insert_event's per-call cost
  // (measured by the publish cells) would make a backlog of millions take minutes.
  std::vector<std::string> preload_sql(const Cell& c, long long deliveries, bool* parallel) override {
    *parallel = false;  // ticks must fall between the chunks
    // Two commits per chunk: not waiting for each flush keeps a backlog of a million under
    // half a minute on a busy disk. The preload is not measured; the CHECKPOINT after it flushes.
    std::vector<std::string> out = {"SET synchronous_commit = off"};
    for (long long from = 1; from <= deliveries; from += max_count_) {
      long long to = std::min(deliveries, from + max_count_ - 1);
      out.push_back(
          strf("INSERT INTO %s (ev_id, ev_time, ev_type, ev_data, ev_extra1)"
               " SELECT nextval(%s), now(), 'ev', (%s)::text, %s FROM generate_series(%lld, %lld) AS i",
               table_.c_str(), sql_lit(event_seq_).c_str(), sql_payload_expr("i").c_str(),
               sql_key_expr(c.keys, "i").c_str(), from, to));
      out.push_back("SELECT pgq.ticker('bench_q')");
    }
    out.push_back("RESET synchronous_commit");
    return out;
  }

  std::vector<ChildSpec> children(const Cell& c, const std::string& conninfo) override {
    std::vector<ChildSpec> out;
    ChildSpec t;
    t.role = Role::External;
    t.label = "pgqd";
    t.conninfo = conninfo;
    t.argv = {"pgqd", ini_};
    t.reports_units = false;
    out.push_back(t);
    if (c.group == Group::Publish) {
      for (int i = 0; i < c.publishers; i++) {
        // The key rides in ev_extra1, as relaybus carries it (NULL when unkeyed).
        out.push_back(publisher(c, i, conninfo, c.batch,
                                c.batch == 1
                                    ? "SELECT pgq.insert_event('bench_q', 'ev', $1, $2, NULL, NULL, NULL)"
                                    : "SELECT count(pgq.insert_event('bench_q', 'ev', u.p, u.k, NULL, NULL, NULL))"
                                      " FROM unnest($1::text[], $2::text[]) AS u(p, k)"));
      }
    } else {
      ChildSpec s;
      s.role = Role::PgqBatch;
      s.label = "consume-0";
      s.conninfo = conninfo;
      s.batch_sql = "SELECT pgq.next_batch('bench_q', 'bench_c')";
      s.events_sql = "SELECT ev_id, ev_extra1, ev_data FROM pgq.get_batch_events($1)";
      s.finish_sql = "SELECT pgq.finish_batch($1)";
      out.push_back(s);
    }
    return out;
  }

  long long backlog(Conn& admin, const Cell& c) override {
    if (c.group == Group::Publish) return admin.one_i64(strf("SELECT count(*) FROM pgq.event_%lld", queue_id_));
    return admin.one_i64(strf("SELECT count(*) FROM pgq.event_%lld e WHERE %s", queue_id_, not_consumed().c_str()));
  }

  Json settings(Conn& admin) override {
    Json j = Json::object();
    j["pgq_version"] = version_;
    Result r = admin.exec(
        "SELECT queue_ticker_max_count, queue_ticker_max_lag::text, queue_ticker_idle_period::text,"
        " queue_rotation_period::text FROM pgq.queue WHERE queue_name = 'bench_q'");
    if (r.rows() > 0) {
      j["ticker_max_count"] = r.i64(0, 0);
      j["ticker_max_lag"] = r.str(0, 1);
      j["ticker_idle_period"] = r.str(0, 2);
      j["rotation_period"] = r.str(0, 3);
    }
    j["pgqd_ticker_period_s"] = 0.1;
    return j;
  }

  Json sample_stats(Conn& admin, const Cell& c) override {
    Json j = Json::object();
    j["ticks"] = admin.one_i64(strf("SELECT count(*) FROM pgq.tick WHERE tick_queue = %lld", queue_id_));
    return j;
  }

  bool checks_exactness(const Cell& c) const override { return c.group == Group::Dispatch; }

  void expected(Conn& setup, const Cell&, std::vector<uint64_t>* ids) override {
    Result r = setup.exec(strf("SELECT ev_id FROM pgq.event_%lld", queue_id_));
    for (int i = 0; i < r.rows(); i++) ids->push_back(ident(r.i64(i, 0), 0));
  }

  // Pending: events the consumer's last finished batch does not cover.
  void pending(Conn& setup, const Cell&, std::vector<PendingRow>* rows) override {
    Result r = setup.exec(strf("SELECT ev_id FROM pgq.event_%lld e WHERE %s", queue_id_, not_consumed().c_str()));
    for (int i = 0; i < r.rows(); i++) rows->push_back(PendingRow{ident(r.i64(i, 0), 0), -1, -1});
  }

  std::string inject_loss(Conn& admin, const Cell&) override {
    Result r =
        admin.exec(strf("DELETE FROM pgq.event_%lld WHERE ev_id = (SELECT max(ev_id) FROM pgq.event_%lld)"
                        " RETURNING ev_id",
                        queue_id_, queue_id_));
    return r.rows() == 0 ? "nothing to delete" : "deleted event " + r.str(0, 0);
  }

 private:
  std::string not_consumed() const {
    return "NOT txid_visible_in_snapshot(e.ev_txid, (SELECT t.tick_snapshot FROM pgq.subscription s"
           " JOIN pgq.tick t ON t.tick_queue = s.sub_queue AND t.tick_id = s.sub_last_tick"
           " WHERE s.sub_queue = " +
           std::to_string(queue_id_) + "))";
  }

  std::string work_, ini_, version_, table_ = "pgq.event_1_0", event_seq_;
  long long queue_id_ = 0;
  int max_count_ = 500;
};

// graphile-worker (npm, bench/graphile): jobs in graphile_worker._private_jobs, added
// with add_job / add_jobs, run by its Node runner (bench/graphile/worker.mjs) with the
// settings of its performance page: concurrentJobs 24, localQueue.size 500,
// completeJobBatchDelay 0, failJobBatchDelay 0, useNodeTime, prepared statements.
// The job-table peers (graphile-worker, River): exactness from one id query each.
static void job_ids(Conn& c, const char* sql, std::vector<uint64_t>* ids) {
  Result r = c.exec(sql);
  for (int i = 0; i < r.rows(); i++) ids->push_back(ident(r.i64(i, 0), 0));
}
static void pending_jobs(Conn& c, const char* sql, std::vector<PendingRow>* rows) {
  Result r = c.exec(sql);
  for (int i = 0; i < r.rows(); i++) rows->push_back(PendingRow{ident(r.i64(i, 0), 0), -1, -1});
}
static std::string delete_one_job(Conn& c, const char* sql) {
  Result r = c.exec(sql);
  return r.rows() == 0 ? "nothing to delete" : "deleted job " + r.str(0, 0);
}

class Graphile : public System {
 public:
  explicit Graphile(std::string repo) : dir_(std::move(repo) + "/bench/graphile") {}
  std::string name() const override { return "graphile"; }

  void install(Conn& setup) override {
    std::string conninfo = std::string("host=") + PQhost(setup.raw()) + " port=" + PQport(setup.raw()) +
                           " user=" + PQuser(setup.raw()) + " dbname=" + PQdb(setup.raw());
    int st = 0;
    std::string log =
        run_capture("cd '" + dir_ + "' && node node_modules/graphile-worker/dist/cli.js --schema-only -c '" +
                        conninfo_url(conninfo) + "' 2>&1",
                    &st);
    if (st != 0) throw std::runtime_error("graphile-worker --schema-only failed:\n" + log);
    version_ = trim(run_capture("cd '" + dir_ + "' && node -p 'require(\"graphile-worker/package.json\").version'"));
  }

  std::vector<std::string> tables(const Cell&) const override {
    return {"graphile_worker._private_jobs", "graphile_worker._private_tasks", "graphile_worker._private_job_queues"};
  }
  std::string main_table(const Cell&) const override { return "graphile_worker._private_jobs"; }
  int rows_per_event(const Cell&) const override { return 1; }

  void prepare(Conn& setup, Conn&, const Cell& c) override {
    setup.exec("TRUNCATE graphile_worker._private_jobs");
    concurrency_ = c.concurrency;
    local_queue_ = c.batch;
  }

  std::vector<std::string> preload_sql(const Cell& c, long long deliveries, bool* parallel) override {
    *parallel = true;
    std::vector<std::string> out;
    const long long chunk = 10000;
    for (long long from = 1; from <= deliveries; from += chunk) {
      long long to = std::min(deliveries, from + chunk - 1);
      out.push_back(
          strf("SELECT count(*) FROM graphile_worker.add_jobs(ARRAY(SELECT ROW('bench', (%s)::json, %s,"
               " NULL, NULL, NULL, NULL, NULL)::graphile_worker.job_spec FROM generate_series(%lld, %lld) AS i))",
               sql_payload_expr("i").c_str(), sql_key_expr(c.keys, "i").c_str(), from, to));
    }
    return out;
  }

  std::vector<ChildSpec> children(const Cell& c, const std::string& conninfo) override {
    std::vector<ChildSpec> out;
    if (c.group == Group::Publish) {
      for (int i = 0; i < c.publishers; i++) {
        // A key becomes the job's queue_name: graphile runs a named queue's jobs one at a time.
        out.push_back(
            publisher(c, i, conninfo, c.batch,
                      c.batch == 1 ? "SELECT (graphile_worker.add_job('bench', $1::json, $2::text)).id"
                                   : "SELECT count(*) FROM graphile_worker.add_jobs(ARRAY(SELECT ROW('bench', u.p, u.k,"
                                     " NULL, NULL, NULL, NULL, NULL)::graphile_worker.job_spec"
                                     " FROM unnest($1::json[], $2::text[]) AS u(p, k)))"));
      }
      return out;
    }
    for (int i = 0; i < c.consumers; i++) {
      ChildSpec s;
      s.role = Role::External;
      s.label = "worker-" + std::to_string(i);
      s.conninfo = conninfo;
      s.argv = {"node", dir_ + "/worker.mjs"};
      s.env = {"BENCH_PG_URL=" + conninfo_url(conninfo), strf("BENCH_CONCURRENCY=%d", c.concurrency),
               strf("BENCH_LOCAL_QUEUE=%d", c.batch), "NODE_PATH=" + dir_ + "/node_modules"};
      out.push_back(s);
    }
    return out;
  }

  long long backlog(Conn& admin, const Cell&) override {
    return admin.one_i64("SELECT count(*) FROM graphile_worker._private_jobs");
  }

  Json settings(Conn&) override {
    Json j = Json::object();
    j["graphile_worker_version"] = version_;
    if (concurrency_ == 0) return j;  // publish cells: no worker runs
    j["concurrentJobs"] = concurrency_;
    j["localQueue.size"] = local_queue_;
    j["completeJobBatchDelay"] = 0;
    j["failJobBatchDelay"] = 0;
    j["useNodeTime"] = true;
    j["preparedStatements"] = true;
    return j;
  }

  bool checks_exactness(const Cell& c) const override { return c.group == Group::Dispatch; }
  void expected(Conn& setup, const Cell&, std::vector<uint64_t>* ids) override {
    job_ids(setup, "SELECT id FROM graphile_worker._private_jobs", ids);
  }
  // Pending: jobs still in the table (the runner releases the ones it had locked when it stops).
  void pending(Conn& setup, const Cell&, std::vector<PendingRow>* rows) override {
    pending_jobs(setup, "SELECT id FROM graphile_worker._private_jobs WHERE last_error IS NULL", rows);
  }
  // Dead: jobs that failed an attempt (the task never fails, so any is a defect).
  void dead(Conn& setup, const Cell&, std::vector<uint64_t>* ids) override {
    job_ids(setup, "SELECT id FROM graphile_worker._private_jobs WHERE last_error IS NOT NULL", ids);
  }
  std::string inject_loss(Conn& admin, const Cell&) override {
    return delete_one_job(admin,
                          "DELETE FROM graphile_worker._private_jobs WHERE id = (SELECT max(id) FROM"
                          " graphile_worker._private_jobs) RETURNING id");
  }

 private:
  std::string dir_, version_;
  int concurrency_ = 0, local_queue_ = 0;
};

// River (Go, github.com/riverqueue/river with its pgx v5 driver; bench/river): jobs in
// river_job, inserted by River's client (client.Insert for one per call, InsertManyFast,
// COPY FROM, for 100) and worked by River clients with the settings of `river bench`
// (FetchCooldown 2 ms, FetchPollInterval 20 ms, MaxWorkers 2,000). Both run in
// bench/river's program (river-bench publish | work); its schema comes from rivermigrate.
// Completed jobs stay in river_job as state 'completed' (River's retention, 24 h by
// default, deletes them later), so a dispatch unit is an UPDATE, not a DELETE.
class River : public System {
 public:
  explicit River(std::string repo) : bin_(std::move(repo) + "/bench/river/river-bench") {}
  std::string name() const override { return "river"; }

  void install(Conn& setup) override {
    std::string conninfo = std::string("host=") + PQhost(setup.raw()) + " port=" + PQport(setup.raw()) +
                           " user=" + PQuser(setup.raw()) + " dbname=" + PQdb(setup.raw());
    int st = 0;
    std::string out = run_capture("BENCH_PG='" + conninfo + "' '" + bin_ + "' migrate 2>&1", &st);
    if (st != 0) throw std::runtime_error("river-bench migrate failed:\n" + out);
    version_ = trim(out);
  }

  std::vector<std::string> tables(const Cell&) const override { return {"public.river_job"}; }
  std::string main_table(const Cell&) const override { return "public.river_job"; }
  int rows_per_event(const Cell&) const override { return 1; }
  // Working a job updates its row (state completed); nothing is deleted, so units are the workers' count.
  bool pgstat_counts_units(const Cell& c) const override { return c.group != Group::Dispatch; }

  void prepare(Conn& setup, Conn&, const Cell& c) override {
    setup.exec("TRUNCATE river_job");
    max_workers_ = c.concurrency;
  }

  // The rows client.InsertMany writes (River's defaults: queue default, priority 1,
  // max_attempts 25, state available), straight from SQL: a backlog of hundreds of
  // thousands through the client would take longer than the sample.
  std::vector<std::string> preload_sql(const Cell& c, long long deliveries, bool* parallel) override {
    *parallel = true;
    std::vector<std::string> out;
    const long long chunk = 10000;
    for (long long from = 1; from <= deliveries; from += chunk) {
      long long to = std::min(deliveries, from + chunk - 1);
      out.push_back(
          strf("INSERT INTO river_job (args, kind, max_attempts, priority, queue, state, scheduled_at)"
               " SELECT %s, 'bench', 25, 1, 'default', 'available', now() FROM generate_series(%lld, %lld) AS i",
               sql_payload_expr("i").c_str(), from, to));
    }
    return out;
  }

  std::vector<ChildSpec> children(const Cell& c, const std::string& conninfo) override {
    std::vector<ChildSpec> out;
    if (c.group == Group::Publish) {
      for (int i = 0; i < c.publishers; i++) {
        ChildSpec s;
        s.role = Role::External;
        s.label = "pub-" + std::to_string(i);
        s.conninfo = conninfo;
        s.argv = {bin_, "publish"};
        s.env = {"BENCH_PG=" + conninfo, strf("BENCH_BATCH=%d", c.batch), strf("BENCH_SEED=%u", seed_of(c, i))};
        out.push_back(s);
      }
      return out;
    }
    for (int i = 0; i < c.consumers; i++) {
      ChildSpec s;
      s.role = Role::External;
      s.label = "worker-" + std::to_string(i);
      s.conninfo = conninfo;
      s.argv = {bin_, "work"};
      s.env = {"BENCH_PG=" + conninfo, strf("BENCH_MAX_WORKERS=%d", c.concurrency)};
      out.push_back(s);
    }
    return out;
  }

  long long backlog(Conn& admin, const Cell& c) override {
    if (c.group == Group::Publish) return admin.one_i64("SELECT count(*) FROM river_job");
    return admin.one_i64("SELECT count(*) FROM river_job WHERE state = 'available'");
  }

  Json settings(Conn&) override {
    Json j = Json::object();
    j["river_version"] = version_;
    if (max_workers_ == 0) return j;  // publish cells: no worker runs
    j["MaxWorkers"] = max_workers_;
    j["FetchCooldown_ms"] = 2;
    j["FetchPollInterval_ms"] = 20;
    j["pool_max_conns"] = 10;
    return j;
  }

  bool checks_exactness(const Cell& c) const override { return c.group == Group::Dispatch; }
  void expected(Conn& setup, const Cell&, std::vector<uint64_t>* ids) override {
    job_ids(setup, "SELECT id FROM river_job", ids);
  }
  // Pending: jobs not completed and without a failed attempt (a stopped client leaves none running).
  void pending(Conn& setup, const Cell&, std::vector<PendingRow>* rows) override {
    pending_jobs(setup, "SELECT id FROM river_job WHERE state <> 'completed' AND errors IS NULL", rows);
  }
  // Dead: jobs with a failed attempt, discarded or cancelled (the job never fails, so any is a defect).
  void dead(Conn& setup, const Cell&, std::vector<uint64_t>* ids) override {
    job_ids(setup, "SELECT id FROM river_job WHERE errors IS NOT NULL OR state IN ('discarded', 'cancelled')", ids);
  }
  std::string inject_loss(Conn& admin, const Cell&) override {
    return delete_one_job(admin,
                          "DELETE FROM river_job WHERE id = (SELECT max(id) FROM river_job"
                          " WHERE state = 'available') RETURNING id");
  }

 private:
  std::string bin_, version_;
  int max_workers_ = 0;
};

std::unique_ptr<System> make_relaybus() { return std::unique_ptr<System>(new Relaybus()); }
std::unique_ptr<System> make_floor() { return std::unique_ptr<System>(new Floor()); }
std::unique_ptr<System> make_pgq(const std::string& work_dir) { return std::unique_ptr<System>(new Pgq(work_dir)); }
std::unique_ptr<System> make_graphile(const std::string& repo) { return std::unique_ptr<System>(new Graphile(repo)); }
std::unique_ptr<System> make_river(const std::string& repo) { return std::unique_ptr<System>(new River(repo)); }

}  // namespace bench
