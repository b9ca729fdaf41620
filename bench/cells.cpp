// The list of cells. Floors come right before the first cell that compares
// with them, so a ratio's two sides run close together in time.

#include "cells.hpp"

#include <fnmatch.h>

#include <set>

namespace bench {

namespace {

struct Builder {
  std::vector<Cell> cells;
  std::set<std::string> names;
  void add(const Cell& c) {
    if (names.insert(c.name).second) cells.push_back(c);
  }
};

Cell pub_floor(int p, int b, int rows) {
  Cell c;
  c.group = Group::Publish;
  c.system = "floor";
  c.variant = "insert";
  c.publishers = p;
  c.batch = b;
  c.handlers = rows;
  c.name = strf("pub.floor.p%d.b%d.r%d", p, b, rows);
  return c;
}

Cell pub_relay(int p, int b, int h, Keys k) {
  Cell c;
  c.group = Group::Publish;
  c.system = "relaybus";
  c.variant = "publish";
  c.publishers = p;
  c.batch = b;
  c.handlers = h;
  c.keys = k;
  c.dispatchers = 1;
  c.name = strf("pub.relay.p%d.b%d.h%d.%s", p, b, h, keys_name(k));
  c.floor = pub_floor(p, b, h).name;
  return c;
}

Cell disp_floor(const std::string& variant, int procs, int batch) {
  Cell c;
  c.group = Group::Dispatch;
  c.system = "floor";
  c.variant = variant;
  c.consumers = procs;
  c.batch = batch;
  c.name = strf("disp.floor.%s.%s%d.b%d", variant.c_str(), variant.find("notify") != std::string::npos ? "s" : "c",
                procs, batch);
  return c;
}

// Pull: defaults = one consumer per handler claiming 100 (per_key 1);
// tuned = two consumers per handler claiming 500, up to 100 of a key per claim.
Cell disp_pull(bool tuned, int fanout, Keys k) {
  Cell c;
  c.group = Group::Dispatch;
  c.system = "relaybus";
  c.variant = "pull";
  c.profile = tuned ? "tuned" : "defaults";
  c.handlers = fanout;
  c.keys = k;
  c.dispatchers = 1;
  c.consumers = fanout * (tuned ? 2 : 1);
  c.batch = tuned ? 500 : 100;
  c.per_key = tuned ? 100 : 1;
  c.name = strf("disp.relay.pull.%s.f%d.%s", c.profile.c_str(), fanout, keys_name(k));
  c.floor = disp_floor("delete", tuned ? 2 : 1, 500).name;
  return c;
}

// Pull scaling (issue 14): `consumers` processes on one unkeyed handler, each
// claiming `batch` (per_key 1), against the DELETE floor with as many processes
// and the same rows per statement.
Cell disp_pull_scale(int consumers, int batch) {
  Cell c = disp_pull(false, 1, Keys::None);
  c.profile = strf("c%d.b%d", consumers, batch);
  c.consumers = consumers;
  c.batch = batch;
  c.name = strf("disp.relay.pull.%s.f1.unkeyed", c.profile.c_str());
  c.floor = disp_floor("delete", consumers, batch).name;
  return c;
}

// Notify: defaults = relaybus.batch_size 500; tuned = 2000. One LISTEN client per handler.
Cell disp_notify(bool ack, int dispatchers, bool tuned, int fanout, Keys k) {
  Cell c;
  c.group = Group::Dispatch;
  c.system = "relaybus";
  c.variant = ack ? "notify-ack" : "notify-fire";
  c.profile = tuned ? "tuned" : "defaults";
  c.handlers = fanout;
  c.keys = k;
  c.dispatchers = dispatchers;
  c.batch_size = tuned ? 2000 : 500;
  c.consumers = fanout;
  c.name =
      strf("disp.relay.%s.d%d.%s.f%d.%s", ack ? "ack" : "fire", dispatchers, c.profile.c_str(), fanout, keys_name(k));
  c.floor = disp_floor("delete+notify", dispatchers > 1 ? 2 : 1, 500).name;
  return c;
}

// The same notify cell, but the dispatchers plan their statements while idle on an
// empty, vacuumed, never-analyzed relay.deliveries, and the backlog arrives as one
// committed burst that nothing analyzes: compared with the preloaded, analyzed cell.
Cell disp_notify_after_idle(int dispatchers, bool tuned, Keys k) {
  Cell c = disp_notify(false, dispatchers, tuned, 1, k);
  c.after_idle = true;
  c.name += ".after_idle";
  return c;
}

// HTTP: the receiver's own ceiling, wrk at `conns` connections with the same request.
Cell http_floor(int conns) {
  Cell c;
  c.group = Group::Dispatch;
  c.system = "floor";
  c.variant = "wrk";
  c.concurrency = conns;
  c.consumers = conns;
  c.name = strf("http.floor.wrk.c%d", conns);
  return c;
}

// HTTP handlers delivering a preloaded backlog to the local nginx at per-handler concurrency conc.
Cell disp_http(int dispatchers, int conc, int fanout, Keys k) {
  Cell c;
  c.group = Group::Dispatch;
  c.system = "relaybus";
  c.variant = "http";
  c.handlers = fanout;
  c.keys = k;
  c.dispatchers = dispatchers;
  c.concurrency = conc;
  c.name = strf("disp.relay.http.d%d.c%d.f%d.%s", dispatchers, conc, fanout, keys_name(k));
  // Requests in flight at once, all dispatchers and handlers together, is what wrk's connections match.
  c.floor = http_floor(std::min(conc * dispatchers * fanout, 256)).name;
  return c;
}

Cell mixed(int rate, bool tuned) {
  Cell c;
  c.group = Group::Mixed;
  c.system = "relaybus";
  c.variant = "notify-fire";
  c.profile = tuned ? "tuned" : "defaults";
  c.rate = rate;
  c.publishers = rate <= 1000 ? 8 : 32;  // enough that fsync latency does not cap the rate
  c.handlers = 1;
  c.keys = Keys::Distinct1000;
  c.dispatchers = tuned ? 2 : 1;
  c.batch_size = tuned ? 2000 : 500;
  c.name = strf("mixed.relay.fire.r%d.%s", rate, c.profile.c_str());
  return c;
}

// The latency floor of the mixed cells: the same publishers, each INSERTing the
// event and sending its pg_notify in the same transaction, to one LISTEN client.
// What is left is PostgreSQL's NOTIFY path and the machine's scheduling.
Cell mixed_floor(int rate) {
  Cell c;
  c.group = Group::Mixed;
  c.system = "floor";
  c.variant = "notify";
  c.rate = rate;
  c.publishers = rate <= 1000 ? 8 : 32;
  c.handlers = 1;
  c.keys = Keys::Distinct1000;
  c.name = strf("mixed.floor.notify.r%d", rate);
  return c;
}

// Peers publish the same payloads, unkeyed, one event per call or 100 per statement.
// PgQ: pgq.insert_event (b100: one statement over unnest); graphile: add_job / add_jobs;
// River: its Go client, Insert / InsertManyFast (b100: COPY FROM).
Cell pub_peer(const std::string& system, int p, int b) {
  Cell c;
  c.group = Group::Publish;
  c.system = system;
  c.variant = "publish";
  c.publishers = p;
  c.batch = b;
  c.handlers = 1;
  c.name = strf("pub.%s.p%d.b%d", system.c_str(), p, b);
  c.floor = pub_floor(p, b, 1).name;
  return c;
}

// PgQ consume: one consumer (every consumer of a queue reads every event) taking batches
// of ticker_max_count events: 500 (PgQ's default) or 5,000.
Cell disp_pgq(int max_count) {
  Cell c;
  c.group = Group::Dispatch;
  c.system = "pgq";
  c.variant = "consume";
  c.profile = max_count == 500 ? "defaults" : "tuned";
  c.consumers = 1;
  c.batch = max_count;
  c.name = strf("disp.pgq.c1.b%d", max_count);
  c.floor = disp_floor("delete", 1, 500).name;
  return c;
}

// graphile-worker: `procs` Node runner processes, concurrentJobs and localQueue.size as
// in graphile-worker's performance page (24 and 500).
Cell disp_graphile(int procs, int concurrency, int local_queue) {
  Cell c;
  c.group = Group::Dispatch;
  c.system = "graphile";
  c.variant = "worker";
  c.profile = "tuned";
  c.consumers = procs;
  c.concurrency = concurrency;
  c.batch = local_queue;
  c.name = strf("disp.graphile.n%d.j%d.lq%d", procs, concurrency, local_queue);
  c.floor = disp_floor("delete", procs > 1 ? 2 : 1, 500).name;
  return c;
}

// River: `procs` worker processes, one River client each, MaxWorkers `max_workers` on its
// default queue (2,000: River's own benchmark, `river bench`).
Cell disp_river(int procs, int max_workers) {
  Cell c;
  c.group = Group::Dispatch;
  c.system = "river";
  c.variant = "worker";
  c.profile = "tuned";
  c.consumers = procs;
  c.concurrency = max_workers;
  c.name = strf("disp.river.n%d.w%d", procs, max_workers);
  c.floor = disp_floor("delete", procs > 1 ? 2 : 1, 500).name;
  return c;
}

void add_with_floor(Builder& b, const Cell& c, const std::vector<Cell>& floors, bool quick) {
  for (const Cell& f : floors)
    if (f.name == c.floor && !b.names.count(f.name)) {
      Cell fq = f;
      fq.quick = quick;
      b.add(fq);
    }
  Cell cq = c;
  cq.quick = quick;
  b.add(cq);
}

}  // namespace

std::vector<Cell> all_cells(bool full_matrix) {
  Builder b;
  std::vector<Cell> floors;
  for (int p : {1, 8, 32})
    for (int bt : {1, 100})
      for (int r : {1, 5}) floors.push_back(pub_floor(p, bt, r));
  for (int procs : {1, 2}) {
    floors.push_back(disp_floor("delete", procs, 500));
    floors.push_back(disp_floor("delete+notify", procs, 500));
  }
  for (int procs : {1, 4})
    for (int bt : {100, 1000}) floors.push_back(disp_floor("delete", procs, bt));

  auto quick_pub = [](int p, int bt, int h, Keys k) {
    return p == 8 && h == 1 && ((k == Keys::None) || (bt == 1 && k == Keys::Distinct1000));
  };
  // Publish: publishers x events per call, then fan-out and keys at 8 publishers.
  if (full_matrix) {
    for (int p : {1, 8, 32})
      for (int bt : {1, 100})
        for (int h : {1, 5})
          for (Keys k : {Keys::None, Keys::Distinct1000, Keys::Hot10, Keys::Hot1})
            add_with_floor(b, pub_relay(p, bt, h, k), floors, quick_pub(p, bt, h, k));
  } else {
    for (int p : {1, 8, 32})
      for (int bt : {1, 100}) add_with_floor(b, pub_relay(p, bt, 1, Keys::None), floors, p == 8);
    for (int bt : {1, 100}) add_with_floor(b, pub_relay(8, bt, 5, Keys::None), floors, false);
    for (Keys k : {Keys::Distinct1000, Keys::Hot10, Keys::Hot1})
      for (int bt : {1, 100}) add_with_floor(b, pub_relay(8, bt, 1, k), floors, quick_pub(8, bt, 1, k));
  }

  // Dispatch from a preloaded backlog.
  for (bool tuned : {false, true}) {
    for (Keys k : {Keys::None, Keys::Distinct1000, Keys::Hot10})
      add_with_floor(b, disp_pull(tuned, 1, k), floors, !tuned && k == Keys::None);
    add_with_floor(b, disp_pull(tuned, 5, Keys::None), floors, false);
  }
  // Pull with 1 and 4 consumers at 100 and 1,000 per claim, each beside its floor.
  for (int bt : {100, 1000})
    for (int n : {1, 4}) add_with_floor(b, disp_pull_scale(n, bt), floors, false);
  for (int d : {1, 2, 4})
    for (bool tuned : {false, true})
      add_with_floor(b, disp_notify(false, d, tuned, 1, Keys::None), floors, (d == 1 && !tuned) || (d == 2 && tuned));
  add_with_floor(b, disp_notify(false, 1, true, 5, Keys::None), floors, false);
  add_with_floor(b, disp_notify(false, 1, true, 1, Keys::Distinct1000), floors, false);
  add_with_floor(b, disp_notify(false, 4, true, 1, Keys::Distinct1000), floors, false);
  add_with_floor(b, disp_notify(false, 1, true, 1, Keys::Hot10), floors, false);
  add_with_floor(b, disp_notify_after_idle(1, false, Keys::None), floors, true);
  add_with_floor(b, disp_notify_after_idle(1, true, Keys::Distinct1000), floors, false);
  add_with_floor(b, disp_notify(true, 1, false, 1, Keys::None), floors, true);
  add_with_floor(b, disp_notify(true, 1, true, 1, Keys::None), floors, false);
  add_with_floor(b, disp_notify(true, 1, true, 1, Keys::Distinct1000), floors, false);
  add_with_floor(b, disp_notify(true, 2, true, 1, Keys::None), floors, false);
  // HTTP to a local nginx, against wrk on the same nginx.
  for (int conns : {1, 16, 64, 128}) floors.push_back(http_floor(conns));
  add_with_floor(b, disp_http(1, 1, 1, Keys::None), floors, false);
  add_with_floor(b, disp_http(1, 16, 1, Keys::None), floors, true);
  add_with_floor(b, disp_http(1, 64, 1, Keys::None), floors, true);
  add_with_floor(b, disp_http(2, 64, 1, Keys::None), floors, false);
  add_with_floor(b, disp_http(1, 64, 1, Keys::Distinct1000), floors, false);
  // The other floors: a completion INSERT on top of the DELETE, and bare pg_notify.
  Cell di = disp_floor("delete+insert", 1, 500);
  b.add(di);
  Cell bn = disp_floor("notify", 1, 500);
  bn.quick = true;
  b.add(bn);

  // Peers, on the same cluster and settings.
  for (const char* sys : {"pgq", "graphile", "river"})
    for (int p : {1, 8, 32})
      for (int bt : {1, 100})
        add_with_floor(b, pub_peer(sys, p, bt), floors, p == 8 && (bt == 1 || std::string(sys) == "pgq"));
  add_with_floor(b, disp_pgq(500), floors, true);
  add_with_floor(b, disp_pgq(5000), floors, false);
  add_with_floor(b, disp_graphile(1, 24, 500), floors, true);
  add_with_floor(b, disp_graphile(2, 24, 500), floors, false);
  add_with_floor(b, disp_river(1, 2000), floors, true);
  add_with_floor(b, disp_river(2, 2000), floors, false);

  // Mixed: paced publishing while notify-fire dispatching; the floors first.
  Cell mf = mixed_floor(1000);
  mf.quick = true;
  b.add(mf);
  b.add(mixed_floor(5000));
  for (auto rt : {std::make_pair(1000, false), std::make_pair(1000, true), std::make_pair(5000, false),
                  std::make_pair(5000, true)}) {
    Cell m = mixed(rt.first, rt.second);
    m.quick = rt.first == 1000 && !rt.second;
    b.add(m);
  }
  return b.cells;
}

bool cell_matches(const Cell& c, const std::string& patterns) {
  for (const std::string& p0 : split(patterns, ',')) {
    std::string p = trim(p0);
    if (p.empty()) continue;
    if (p.find_first_of("*?[") == std::string::npos) p = "*" + p + "*";
    if (fnmatch(p.c_str(), c.name.c_str(), 0) == 0) return true;
  }
  return false;
}

std::vector<Cell> select_cells(const std::vector<Cell>& all, bool quick, const std::string& patterns,
                               bool with_floors) {
  std::set<std::string> want;
  for (const Cell& c : all) {
    // --cells picks cells by name; --quick alone picks the quick subset (and always shortens windows).
    bool ok = patterns.empty() ? (!quick || c.quick) : cell_matches(c, patterns);
    if (ok) want.insert(c.name);
  }
  if (with_floors)
    for (const Cell& c : all)
      if (want.count(c.name) && !c.floor.empty()) want.insert(c.floor);
  std::vector<Cell> out;
  for (const Cell& c : all)
    if (want.count(c.name)) out.push_back(c);
  return out;
}

}  // namespace bench
