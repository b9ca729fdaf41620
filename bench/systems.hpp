// The systems a cell can run against: relaybus and the floor today; PgQ and an
// application queue (graphile-worker, pg-boss, River) slot in as further
// System implementations: install once, prepare per sample, SQL for the child
// processes, and (optionally) the exactness hooks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model.hpp"
#include "pg.hpp"

namespace bench {

// A delivery's identity for the exactness check: event id and handler index.
inline uint64_t ident(int64_t event_id, int handler) { return uint64_t(event_id) * 8 + uint64_t(handler & 7); }

struct PendingRow {
  uint64_t id;     // ident()
  int32_t key_id;  // -1 unkeyed
  int64_t seq;     // -1 NULL
};

class System {
 public:
  virtual ~System() = default;
  virtual std::string name() const = 0;
  // Once per run, in the bench database (setup = the workload role, which owns the objects).
  virtual void install(Conn& setup) = 0;
  // Tables whose pg_stat_user_tables counters the report shows ("schema.table").
  virtual std::vector<std::string> tables(const Cell& c) const = 0;
  // The table whose inserted (publish, mixed) or deleted (dispatch) rows count units in pgstat.
  virtual std::string main_table(const Cell& c) const = 0;
  // Whether pgstat's rows of main_table count the units (dispatch: deleted rows). PgQ
  // deletes nothing (it truncates rotated tables), so its units are the consumers' count.
  virtual bool pgstat_counts_units(const Cell& c) const { return true; }
  // Rows of main_table per published event (fan-out) for pgstat-based units.
  virtual int rows_per_event(const Cell& c) const { return c.handlers; }
  // Before each sample: empty state, settings, handlers/queues/routes. Delivery stays off
  // until start_delivery() if the system delivers on its own (relaybus notify).
  virtual void prepare(Conn& setup, Conn& admin, const Cell& c) = 0;
  // Dispatch cells: the statements that load `deliveries` deliveries to hand over. The
  // harness runs them on two connections at once when `parallel` is left true.
  virtual std::vector<std::string> preload_sql(const Cell& c, long long deliveries, bool* parallel) = 0;
  // The child processes of a sample.
  virtual std::vector<ChildSpec> children(const Cell& c, const std::string& conninfo) = 0;
  // In-server delivery (background workers): start after the consumers listen, stop after the window.
  virtual void start_delivery(Conn& admin, const Cell& c) {}
  virtual void stop_delivery(Conn& admin, const Cell& c) {}
  // Deliveries left to hand over (-1: not applicable, e.g. a bare pg_notify floor).
  virtual long long backlog(Conn& admin, const Cell& c) = 0;
  // Server processes whose memory is reported (relaybus dispatchers).
  virtual std::vector<int> server_pids(Conn& admin) { return {}; }
  // Anything the system reports about itself at the end of the window (stored in the sample).
  virtual Json sample_stats(Conn& admin, const Cell& c) { return Json(); }
  // Settings relevant to the cell, as the server has them.
  virtual Json settings(Conn& admin) { return Json::object(); }
  // Exactness: whether it applies; pending deliveries (after delivery stopped); dead ones.
  virtual bool checks_exactness(const Cell& c) const { return false; }
  virtual void expected(Conn& setup, const Cell& c, std::vector<uint64_t>* ids) {}
  virtual void pending(Conn& setup, const Cell& c, std::vector<PendingRow>* rows) {}
  virtual void dead(Conn& setup, const Cell& c, std::vector<uint64_t>* ids) {}
  // Test mode: remove one pending delivery behind the consumers' back.
  virtual std::string inject_loss(Conn& admin, const Cell& c) { return "not supported"; }
};

std::unique_ptr<System> make_relaybus();
std::unique_ptr<System> make_floor();
// Peers. work_dir: where they keep files of their own (pgqd's configuration and log);
// repo: the checkout (bench/graphile holds graphile-worker's package).
std::unique_ptr<System> make_pgq(const std::string& work_dir);
std::unique_ptr<System> make_graphile(const std::string& repo);
// repo: bench/river holds River's Go program (built by the harness into bench/river/river-bench).
std::unique_ptr<System> make_river(const std::string& repo);
// "host=... port=... user=... dbname=..." as a postgres:// URL (for Node's pg).
std::string conninfo_url(const std::string& conninfo);

// SQL expressions shared by preloads: the payload of row i and its key.
std::string sql_payload_expr(const std::string& i);
std::string sql_key_expr(Keys k, const std::string& i);

}  // namespace bench
