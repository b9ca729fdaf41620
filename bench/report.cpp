// report.md and comparison.json from the samples of one run.

#include "report.hpp"

#include <functional>
#include <set>

#include "charts.hpp"

namespace bench {

namespace {

struct Agg {
  Cell cell;
  int samples = 0, valid = 0;
  std::map<std::string, double> m;  // medians over valid samples (all samples if none is valid)
  std::vector<std::string> invalid;
};

double get(const std::map<std::string, double>& m, const std::string& k) {
  auto it = m.find(k);
  return it == m.end() ? NAN : it->second;
}

std::string ratio(double a, double b) {
  if (!std::isfinite(a) || !std::isfinite(b) || b <= 0) return "–";
  return strf("%.2fx", a / b);
}

std::map<std::string, Agg> aggregate(const std::vector<SampleResult>& samples, std::vector<std::string>* order) {
  std::map<std::string, Agg> out;
  std::map<std::string, std::vector<const SampleResult*>> by;
  for (const SampleResult& s : samples) {
    if (!by.count(s.cell.name)) order->push_back(s.cell.name);
    by[s.cell.name].push_back(&s);
  }
  for (auto& kv : by) {
    Agg a;
    a.cell = kv.second.front()->cell;
    std::vector<const SampleResult*> use;
    for (const SampleResult* s : kv.second) {
      a.samples++;
      if (s->valid) {
        a.valid++;
        use.push_back(s);
      }
      for (auto& w : s->invalid) a.invalid.push_back(w);
    }
    if (use.empty()) use = kv.second;
    std::set<std::string> keys;
    for (const SampleResult* s : use)
      for (auto& m : s->m) keys.insert(m.first);
    for (const std::string& k : keys) {
      std::vector<double> v;
      for (const SampleResult* s : use) v.push_back(get(s->m, k));
      a.m[k] = median(v);
    }
    // Exactness counters: worst case, not the median.
    for (const char* k : {"ex_lost", "ex_dup", "ex_order", "ex_dead", "ex_unexpected", "ex_delivered_pending"}) {
      double worst = NAN;
      for (const SampleResult* s : kv.second) {
        double v = get(s->m, k);
        if (std::isfinite(v)) worst = std::isfinite(worst) ? std::max(worst, v) : v;
      }
      if (std::isfinite(worst)) a.m[k] = worst;
    }
    out[kv.first] = a;
  }
  return out;
}

std::string samples_col(const Agg& a) {
  if (a.valid == a.samples) return std::to_string(a.samples);
  return strf("%d (%d invalid)", a.samples, a.samples - a.valid);
}

std::string exact_col(const Agg& a) {
  if (!std::isfinite(get(a.m, "ex_lost"))) return "–";
  return strf("%s/%s/%s/%s", num(get(a.m, "ex_lost")).c_str(), num(get(a.m, "ex_dup")).c_str(),
              num(get(a.m, "ex_order")).c_str(), num(get(a.m, "ex_dead")).c_str());
}

std::string pct(double share) { return std::isfinite(share) ? strf("%.0f%%", 100 * share) : "–"; }

double g_min_spin = NAN;
std::string spin(double v) {
  if (!std::isfinite(v)) return "–";
  std::string s = num(v);
  if (std::isfinite(g_min_spin) && v > 1.25 * g_min_spin) s += " (busy)";
  return s;
}

std::string mib(double kb) { return std::isfinite(kb) ? strf("%.1f", kb / 1024.0) : "–"; }

bool is_peer(const Cell& c) { return c.system != "relaybus" && c.system != "floor"; }

// The relaybus cell a peer cell is compared with: the same publishers and batch with one
// handler, unkeyed; for dispatch, the fastest relaybus dispatch cell of the run with one
// handler, unkeyed (pull or notify: the question is how fast each system hands events over
// to its consumers; http cells also measure the receiver, so they are left out).
std::string relaybus_counterpart(const Cell& c, const std::map<std::string, Agg>& agg) {
  if (c.group == Group::Publish) return strf("pub.relay.p%d.b%d.h1.unkeyed", c.publishers, c.batch);
  std::string best;
  double best_rate = -1;
  for (auto& kv : agg) {
    const Agg& a = kv.second;
    if (a.cell.system != "relaybus" || a.cell.group != Group::Dispatch || a.cell.handlers != 1 ||
        a.cell.keys != Keys::None || a.cell.variant == "http")
      continue;
    double r = get(a.m, "rate");
    if (std::isfinite(r) && r > best_rate) {
      best_rate = r;
      best = kv.first;
    }
  }
  return best;
}

}  // namespace

std::string write_reports(const ReportInput& in) {
  std::vector<std::string> order;
  std::map<std::string, Agg> agg = aggregate(in.samples, &order);
  const Json* build = in.env.find("build");
  const Json* mach = in.env.find("machine");
  const Json* pg = in.env.find("postgres");
  auto jstr = [](const Json* o, const char* k) -> std::string {
    if (o == nullptr) return "?";
    const Json* v = o->find(k);
    if (v == nullptr) return "?";
    if (v->type() == Json::Str) return v->str();
    return v->dump();
  };

  std::string md;
  md += "# relaybus benchmark " + in.run_id + "\n\n";
  int total = int(in.samples.size()), invalid = 0;
  std::vector<double> spins, busy;
  for (const SampleResult& s : in.samples) {
    if (!s.valid) invalid++;
    spins.push_back(get(s.m, "spin_ms"));
    busy.push_back(get(s.m, "cpu_busy"));
  }
  std::sort(spins.begin(), spins.end());
  spins.erase(std::remove_if(spins.begin(), spins.end(), [](double x) { return !std::isfinite(x); }), spins.end());
  g_min_spin = spins.empty() ? NAN : spins.front();
  md +=
      strf("Build `%s`%s, relaybus.so sha256 `%.12s`; %s, %s CPUs (%s), %s; %s.\n",
           jstr(build, "git_ref").substr(0, 12).c_str(), jstr(build, "git_dirty") == "true" ? " (dirty tree)" : "",
           jstr(build, "relaybus_so_sha256").c_str(), jstr(mach, "kernel").c_str(), jstr(mach, "nproc").c_str(),
           jstr(mach, "cpu_model").c_str(), jstr(mach, "mem_total").c_str(), jstr(pg, "version").substr(0, 40).c_str());
  md +=
      "Cluster: fsync, synchronous_commit and full_page_writes on; shared_buffers 1GB, max_wal_size 4GB, "
      "checkpoint_timeout 30min, a CHECKPOINT before every sample (env.json has every setting).\n";
  md += strf(
      "Run: `%s`, %.1f minutes, %d samples, %d invalid. CPU spin before each sample: %s to %s ms "
      "(median %s); \"(busy)\" marks a sample whose spin took over 1.25x the quietest one: the machine was busy.\n\n",
      in.args.c_str(), in.minutes, total, invalid, num(spins.empty() ? NAN : spins.front()).c_str(),
      num(spins.empty() ? NAN : spins.back()).c_str(), num(median(spins)).c_str());
  for (const std::string& n : in.notes) md += n + "; its cells were skipped.\n\n";
  md +=
      "Rates are per second of a fixed window after a warm-up; counters are per event (publish, mixed) or per "
      "delivery (dispatch), from statistics reset at the start of the window. Ratios compare cells of this run.\n\n";

  auto floor_rate = [&](const Agg& a) {
    auto it = agg.find(a.cell.floor);
    return it == agg.end() ? NAN : get(it->second.m, "rate");
  };
  // A chart beside a table: NAME.svg in the report's directory, linked below it.
  auto emit_chart = [&](const std::string& name, const Chart& c) {
    if (c.rows.empty()) return;
    write_file(in.out_dir + "/" + name + ".svg", chart_svg(c));
    md += "![" + c.title + "](" + name + ".svg)\n\n";
  };
  auto ratio_chart = [](const std::string& title) {
    Chart c;
    c.title = title;
    c.unit = "x";
    c.reference = 1.0;
    return c;
  };

  // ---- publish
  bool any_pub = false, any_disp = false, any_mixed = false;
  for (auto& n : order) {
    Group g = agg[n].cell.group;
    any_pub |= g == Group::Publish;
    any_disp |= g == Group::Dispatch;
    any_mixed |= g == Group::Mixed;
  }
  if (any_pub) {
    md += "## Publish\n\n";
    md +=
        "`pN` publishers, `bN` events per call (relay_publish for 1, relay_publish_batch for 100), `hN` handlers "
        "routed, keys none / 1,000 distinct / 10 hot / 1 hot. Floor: a bare INSERT of the same rows (`rN` rows "
        "per event) into a plain table, one statement per call. Peers: `pgq` (pgq.insert_event per event, or "
        "100 in one statement over unnest), `graphile` (graphile_worker.add_job, or add_jobs of 100) and `river` "
        "(River's Go client, one process and connection per publisher: Insert, or InsertManyFast of 100).\n\n";
    md +=
        "| cell | events/s | floor events/s | ratio | client stmts/call | stmts/event | WAL B/event | WAL rec/event "
        "| FPI/event | key_seqs upd/event (HOT) | call p99 ms | machine CPU µs/event | dispatcher CPU | spin ms | samples |\n";
    md += "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n";
    Chart pub_chart = ratio_chart("Publish: events/s against the floor's (ratio)");
    for (auto& n : order) {
      const Agg& a = agg[n];
      if (a.cell.group != Group::Publish || a.cell.system == "floor") continue;
      pub_chart.rows.push_back({n, {get(a.m, "rate") / floor_rate(a)}});
      double ks = get(a.m, "keyseq_upd_pu");
      std::string kcol = std::isfinite(ks) && ks > 0 ? strf("%.2f (%.0f%%)", ks, 100 * get(a.m, "keyseq_hot_share"))
                                                     : strf("%.2f", std::isfinite(ks) ? ks : 0.0);
      md += strf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", n.c_str(),
                 num(get(a.m, "rate")).c_str(), num(floor_rate(a)).c_str(),
                 ratio(get(a.m, "rate"), floor_rate(a)).c_str(), num(get(a.m, "stmts_top_per_call"), 2).c_str(),
                 num(get(a.m, "stmts_pu"), 2).c_str(), num(get(a.m, "wal_bytes_pu")).c_str(),
                 num(get(a.m, "wal_records_pu"), 2).c_str(), num(get(a.m, "wal_fpi_pu"), 3).c_str(), kcol.c_str(),
                 num(get(a.m, "call_p99_us") / 1000, 2).c_str(), num(get(a.m, "cpu_us_pu")).c_str(),
                 pct(get(a.m, "dispatcher_cpu_share")).c_str(), spin(get(a.m, "spin_ms")).c_str(),
                 samples_col(a).c_str());
    }
    md += "\n";
    emit_chart("publish", pub_chart);
    md +=
        "Floors:\n\n| floor cell | events/s | rows/s | stmts/event | WAL B/event | WAL rec/event | FPI/event | call p99 ms | machine CPU µs/event | spin ms |\n";
    md += "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
    for (auto& n : order) {
      const Agg& a = agg[n];
      if (a.cell.group != Group::Publish || a.cell.system != "floor") continue;
      md += strf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", n.c_str(), num(get(a.m, "rate")).c_str(),
                 num(get(a.m, "rate") * a.cell.handlers).c_str(), num(get(a.m, "stmts_pu"), 2).c_str(),
                 num(get(a.m, "wal_bytes_pu")).c_str(), num(get(a.m, "wal_records_pu"), 2).c_str(),
                 num(get(a.m, "wal_fpi_pu"), 3).c_str(), num(get(a.m, "call_p99_us") / 1000, 2).c_str(),
                 num(get(a.m, "cpu_us_pu")).c_str(), spin(get(a.m, "spin_ms")).c_str());
    }
    md += "\n";
  }

  // ---- dispatch
  if (any_disp) {
    md += "## Dispatch from a preloaded backlog\n\n";
    md +=
        "`pull`: consumer processes looping BEGIN; relay_claim; relay_ack; COMMIT (defaults: one per handler, max "
        "100, per_key 1; tuned: two per handler, max 500, per_key 100). `fire`/`ack`: notify handlers delivered "
        "by `dN` background dispatchers to one LISTEN process per handler (defaults: relaybus.batch_size 500; "
        "tuned: 2000); ack mode acknowledges with relay_ack. `fN` fan-out. Floors: a batched "
        "`DELETE ... RETURNING` (`cN` processes, 500 rows per statement), and the same DELETE with pg_notify of "
        "each row (`sN` processes). Peers: `pgq` (one consumer looping next_batch / get_batch_events / "
        "finish_batch in a transaction; batches of `bN` = ticker_max_count events; pgqd ticking), `graphile` "
        "(`nN` graphile-worker runner processes, `jN` concurrentJobs, `lqN` localQueue.size; a task that only "
        "counts) and `river` (`nN` Go processes, one River client each, `wN` MaxWorkers, FetchCooldown 2 ms, "
        "FetchPollInterval 20 ms as in `river bench`; a job that does nothing, counted when River reports it "
        "completed). "
        "`http`: http handlers (`cN` per-handler concurrency, signed requests, envelope body) "
        "delivered by `dN` dispatchers to a local nginx (`return 200`, one worker, keep-alive, logging each "
        "request's webhook-id, which the exactness check reads); floor `http.floor.wrk.cN`: wrk with the same "
        "request (POST, same body and headers) at N connections against the same nginx, counted from the same log "
        "(its rows/s are requests/s).\n\n";
    md +=
        "| cell | deliveries/s | floor | floor/s | ratio | stmts/delivery | WAL B/delivery | WAL rec/delivery | "
        "upd/delivery | del/delivery | dispatcher CPU | dispatcher CPU µs/delivery | dispatcher MiB (RSS / anon) | lost/dup/order/dead | spin ms | samples |\n";
    md +=
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n";
    Chart disp_chart = ratio_chart("Dispatch: deliveries/s against the floor's (ratio)");
    for (auto& n : order) {
      const Agg& a = agg[n];
      if (a.cell.group != Group::Dispatch || a.cell.system == "floor") continue;
      disp_chart.rows.push_back({n, {get(a.m, "rate") / floor_rate(a)}});
      std::string memcol =
          std::isfinite(get(a.m, "rss_kb")) ? mib(get(a.m, "rss_kb")) + " / " + mib(get(a.m, "rss_anon_kb")) : "–";
      // Dispatcher CPU time per delivery: less sensitive to a busy machine than the rate.
      double cpu_us = get(a.m, "dispatcher_cpu_share") * 1e6 / get(a.m, "rate");
      md += strf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", n.c_str(),
                 num(get(a.m, "rate")).c_str(), a.cell.floor.c_str(), num(floor_rate(a)).c_str(),
                 ratio(get(a.m, "rate"), floor_rate(a)).c_str(), num(get(a.m, "stmts_pu"), 3).c_str(),
                 num(get(a.m, "wal_bytes_pu")).c_str(), num(get(a.m, "wal_records_pu"), 2).c_str(),
                 num(get(a.m, "main_upd_pu"), 3).c_str(), num(get(a.m, "main_del_pu"), 2).c_str(),
                 pct(get(a.m, "dispatcher_cpu_share")).c_str(), num(cpu_us).c_str(), memcol.c_str(),
                 exact_col(a).c_str(), spin(get(a.m, "spin_ms")).c_str(), samples_col(a).c_str());
    }
    md += "\n";
    emit_chart("dispatch", disp_chart);
    md += "Floors:\n\n| floor cell | rows/s | stmts/row | WAL B/row | WAL rec/row | FPI/row | spin ms |\n";
    md += "| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n";
    for (auto& n : order) {
      const Agg& a = agg[n];
      if (a.cell.group != Group::Dispatch || a.cell.system != "floor") continue;
      md += strf("| %s | %s | %s | %s | %s | %s | %s |\n", n.c_str(), num(get(a.m, "rate")).c_str(),
                 num(get(a.m, "stmts_pu"), 3).c_str(), num(get(a.m, "wal_bytes_pu")).c_str(),
                 num(get(a.m, "wal_records_pu"), 2).c_str(), num(get(a.m, "wal_fpi_pu"), 3).c_str(),
                 spin(get(a.m, "spin_ms")).c_str());
    }
    md += "\n(`disp.floor.notify` is a bare pg_notify of prebuilt payloads with nothing to remove.)\n\n";
  }

  // ---- mixed
  if (any_mixed) {
    md += "## Mixed: paced publishing while dispatching (notify fire)\n\n";
    md +=
        "Publisher processes publish one keyed event per call (1,000 keys) on a fixed schedule; latency is from "
        "the publisher's clock right after its COMMIT returned to the LISTEN client's clock on receipt (same "
        "machine, CLOCK_REALTIME), for events committed inside the window. A negative latency means the "
        "notification arrived before the publisher's COMMIT returned.\n\n";
    md +=
        "| cell | target/s | accepted/s | delivered/s | p50 ms | p95 ms | p99 ms | max ms | negative | WAL B/event | "
        "stmts/event | dispatcher MiB (RSS / anon) | lost/dup/order/dead | spin ms | samples |\n";
    md += "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n";
    Chart mixed_chart;
    mixed_chart.title = "Mixed: commit-to-handler latency (ms)";
    mixed_chart.unit = " ms";
    mixed_chart.series = {"p50", "p95", "p99"};
    for (auto& n : order) {
      const Agg& a = agg[n];
      if (a.cell.group != Group::Mixed) continue;
      mixed_chart.rows.push_back({n, {get(a.m, "lat_p50_ms"), get(a.m, "lat_p95_ms"), get(a.m, "lat_p99_ms")}});
      std::string memcol =
          std::isfinite(get(a.m, "rss_kb")) ? mib(get(a.m, "rss_kb")) + " / " + mib(get(a.m, "rss_anon_kb")) : "–";
      md += strf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", n.c_str(),
                 num(get(a.m, "target_rate")).c_str(), num(get(a.m, "accepted_rate")).c_str(),
                 num(get(a.m, "delivered_rate")).c_str(), num(get(a.m, "lat_p50_ms"), 2).c_str(),
                 num(get(a.m, "lat_p95_ms"), 2).c_str(), num(get(a.m, "lat_p99_ms"), 2).c_str(),
                 num(get(a.m, "lat_max_ms"), 1).c_str(), num(get(a.m, "lat_negative")).c_str(),
                 num(get(a.m, "wal_bytes_pu")).c_str(), num(get(a.m, "stmts_pu"), 2).c_str(), memcol.c_str(),
                 exact_col(a).c_str(), spin(get(a.m, "spin_ms")).c_str(), samples_col(a).c_str());
    }
    md += "\n";
    emit_chart("mixed", mixed_chart);
  }

  // ---- peers, beside relaybus
  bool any_peer = false;
  for (auto& n : order) any_peer |= is_peer(agg[n].cell);
  auto rate_of = [&](const std::string& name) {
    auto it = agg.find(name);
    return it == agg.end() ? NAN : get(it->second.m, "rate");
  };
  if (any_peer) {
    md += "## Peers beside relaybus\n\n";
    md +=
        "Each peer cell against its relaybus counterpart in this run (publish: same publishers and batch, one "
        "handler, unkeyed; dispatch: the fastest relaybus dispatch cell with one handler, unkeyed). The ratio is "
        "relaybus / peer: above 1 means relaybus is faster. Counters per event (publish) or per delivery "
        "(dispatch) for each side.\n\n";
    md +=
        "| peer cell | peer /s | relaybus cell | relaybus /s | relaybus / peer | stmts/unit (peer / relaybus) | "
        "WAL B/unit (peer / relaybus) | WAL rec/unit (peer / relaybus) | rows ins/upd/del per unit (peer) | "
        "lost/dup/order/dead | spin ms | samples |\n";
    md += "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n";
    Chart peer_chart = ratio_chart("Peers: relaybus against each peer (ratio; above 1: relaybus is faster)");
    for (auto& n : order) {
      const Agg& a = agg[n];
      if (!is_peer(a.cell)) continue;
      std::string rc = relaybus_counterpart(a.cell, agg);
      peer_chart.rows.push_back({n, {rate_of(rc) / get(a.m, "rate")}});
      auto it = agg.find(rc);
      const Agg* r = it == agg.end() ? nullptr : &it->second;
      auto both = [&](const char* k, int prec) {
        return num(get(a.m, k), prec) + " / " + (r ? num(get(r->m, k), prec) : std::string("–"));
      };
      md += strf("| %s | %s | %s | %s | %s | %s | %s | %s | %s / %s / %s | %s | %s | %s |\n", n.c_str(),
                 num(get(a.m, "rate")).c_str(), r ? rc.c_str() : "– (not run)", num(rate_of(rc)).c_str(),
                 ratio(rate_of(rc), get(a.m, "rate")).c_str(), both("stmts_pu", 3).c_str(),
                 both("wal_bytes_pu", 0).c_str(), both("wal_records_pu", 2).c_str(),
                 num(get(a.m, "main_ins_pu"), 2).c_str(), num(get(a.m, "main_upd_pu"), 2).c_str(),
                 num(get(a.m, "main_del_pu"), 2).c_str(), exact_col(a).c_str(), spin(get(a.m, "spin_ms")).c_str(),
                 samples_col(a).c_str());
    }
    md += "\n";
    emit_chart("peers", peer_chart);
    md +=
        "PgQ's consumer writes almost nothing per event: it never deletes or updates an event row; whole "
        "event tables are truncated by rotation (queue_rotation_period, 2 hours), outside any window.\n\n";
  }

  // ---- goals of issue 5
  md += "## Goals (issue 5), as measured in this run\n\n| goal | measured | met |\n| --- | --- | --- |\n";
  auto find = [&](const std::string& name) -> const Agg* {
    auto it = agg.find(name);
    return it == agg.end() ? nullptr : &it->second;
  };
  auto goal_ratio = [&](const std::string& cell, double want, const std::string& text) {
    const Agg* a = find(cell);
    if (a == nullptr) return;
    double r = get(a->m, "rate") / floor_rate(*a);
    md += strf("| %s | %s (%s) | %s |\n", text.c_str(), std::isfinite(r) ? strf("%.2fx", r).c_str() : "–", cell.c_str(),
               !std::isfinite(r) ? "?" : (r >= want ? "yes" : "**no**"));
  };
  goal_ratio("pub.relay.p8.b1.h1.unkeyed", 0.85, "publish, 1 event/call, 8 publishers >= 0.85x floor");
  goal_ratio("pub.relay.p8.b100.h1.unkeyed", 0.75, "publish, 100 events/call, 8 publishers >= 0.75x floor");
  if (const Agg* a = find("pub.relay.p8.b1.h1.unkeyed")) {
    double s = get(a->m, "stmts_top_per_call"), w = get(a->m, "wal_bytes_pu");
    md += strf("| one client round trip per publish | %s client statements per call | %s |\n", num(s, 2).c_str(),
               std::isfinite(s) ? (s <= 1.01 ? "yes" : "**no**") : "?");
    md += strf("| WAL per published event (1 handler) <= 900 B | %s B | %s |\n", num(w).c_str(),
               std::isfinite(w) ? (w <= 900 ? "yes" : "**no**") : "?");
  }
  for (const char* cell : {"disp.relay.fire.d1.defaults.f1.unkeyed", "disp.relay.pull.defaults.f1.unkeyed"}) {
    if (const Agg* a = find(cell)) {
      double w = get(a->m, "wal_bytes_pu"), u = get(a->m, "main_upd_pu");
      md += strf("| dispatch WAL per delivery <= 400 B (%s) | %s B | %s |\n", cell, num(w).c_str(),
                 std::isfinite(w) ? (w <= 400 ? "yes" : "**no**") : "?");
      md += strf("| no UPDATE of delivery rows (%s) | %s updates/delivery | %s |\n", cell, num(u, 3).c_str(),
                 std::isfinite(u) ? (u == 0 ? "yes" : "**no**") : "?");
    }
  }
  for (auto& n : order) {
    const Agg& a = agg[n];
    if (a.cell.group != Group::Dispatch || a.cell.system != "relaybus" || a.cell.variant == "notify-ack") continue;
    if (a.cell.keys != Keys::None || a.cell.handlers != 1) continue;
    goal_ratio(n, 0.5,
               a.cell.variant == "http" ? "HTTP >= 0.5x the receiver's load-generator rate (wrk)"
                                        : "dispatch >= 0.5x the dispatch floor");
  }
  // Issue 14: a burst after idle (plans made on an empty, never-analyzed table)
  // against the same backlog preloaded and analyzed.
  for (auto& n : order) {
    const Agg& a = agg[n];
    if (!a.cell.after_idle) continue;
    std::string base = n.substr(0, n.size() - std::string(".after_idle").size());
    double r = get(a.m, "rate") / rate_of(base);
    md += strf("| burst after idle >= 0.8x the analyzed backlog | %s (%s / %s) | %s |\n",
               std::isfinite(r) ? strf("%.2fx", r).c_str() : "–", n.c_str(), base.c_str(),
               !std::isfinite(r) ? "?" : (r >= 0.8 ? "yes" : "**no**"));
  }
  if (const Agg* a = find("mixed.relay.fire.r1000.defaults")) {
    double p = get(a->m, "lat_p99_ms");
    md += strf("| commit-to-handler p99 < 5 ms at 1,000 events/s | %s ms | %s |\n", num(p, 2).c_str(),
               std::isfinite(p) ? (p < 5 ? "yes" : "**no**") : "?");
  }
  double rss = NAN, own = NAN;
  for (auto& n : order) {
    double v = get(agg[n].m, "rss_kb"), o = v - get(agg[n].m, "rss_shmem_kb");
    if (std::isfinite(v)) rss = std::isfinite(rss) ? std::max(rss, v) : v;
    if (std::isfinite(o)) own = std::isfinite(own) ? std::max(own, o) : o;
  }
  if (std::isfinite(rss))
    md += strf(
        "| dispatcher RSS < 32 MiB | max %s MiB without shared memory (VmRSS - RssShmem); max VmRSS %s MiB "
        "counts the shared buffers it touched | %s |\n",
        mib(own).c_str(), mib(rss).c_str(), own < 32 * 1024 ? "yes" : "**no**");
  for (int b : {1, 100}) {
    std::string rc = strf("pub.relay.p8.b%d.h1.unkeyed", b), pc = strf("pub.pgq.p8.b%d", b);
    double r = rate_of(rc) / rate_of(pc);
    md += strf("| publish ahead of PgQ (b%d, 8 publishers) | %s (%s / %s) | %s |\n", b,
               std::isfinite(r) ? strf("%.2fx", r).c_str() : "– (not run)", rc.c_str(), pc.c_str(),
               !std::isfinite(r) ? "?" : (r > 1 ? "yes" : "**no**"));
  }
  {
    // The fastest application-queue peer (graphile-worker or River) against the fastest relaybus dispatch.
    std::string best_peer, best_relay;
    double peer = NAN, relay = NAN;
    for (auto& n : order) {
      const Agg& a = agg[n];
      if (a.cell.group != Group::Dispatch || (a.cell.system != "graphile" && a.cell.system != "river")) continue;
      double v = get(a.m, "rate");
      if (std::isfinite(v) && !(v <= peer)) {
        peer = v;
        best_peer = n;
      }
    }
    if (!best_peer.empty()) {
      best_relay = relaybus_counterpart(agg[best_peer].cell, agg);
      relay = rate_of(best_relay);
    }
    double r = relay / peer;
    md += strf("| dispatch >= 2x the fastest application-queue peer | %s | %s |\n",
               std::isfinite(r) ? strf("%.2fx (%s %s/s / %s %s/s)", r, best_relay.c_str(), num(relay).c_str(),
                                       best_peer.c_str(), num(peer).c_str())
                                      .c_str()
                                : "– (needs a graphile or river and a relaybus dispatch cell, f1 unkeyed)",
               !std::isfinite(r) ? "?" : (r >= 2 ? "yes" : "**no**"));
  }
  md += "\n";

  // ---- invalid samples
  md += "## Invalid samples\n\n";
  if (invalid == 0) {
    md += "None: every sample was valid";
    bool any_ex = false;
    for (const SampleResult& s : in.samples) any_ex |= s.exact_checked;
    md +=
        any_ex
            ? " (exactness checked after every dispatch and mixed sample: 0 lost, 0 duplicated, 0 out of order, 0 dead).\n\n"
            : ".\n\n";
  } else {
    for (const SampleResult& s : in.samples)
      if (!s.valid)
        for (auto& w : s.invalid) md += strf("- `%s` sample %d: %s\n", s.cell.name.c_str(), s.sample_no, w.c_str());
    md += "\n";
  }
  md += "Per-sample details (statement lists, table counters, dispatcher memory, child counts) are in samples.jsonl.\n";
  write_file(in.out_dir + "/report.md", md);

  // ---- comparison.json
  Json cmp = Json::object();
  cmp["run_id"] = in.run_id;
  if (build) cmp["build"] = *build;
  Json cells = Json::array();
  for (auto& n : order) {
    const Agg& a = agg[n];
    Json c = Json::object();
    c["cell"] = n;
    c["group"] = group_name(a.cell.group);
    c["system"] = a.cell.system;
    c["samples"] = a.samples;
    c["valid_samples"] = a.valid;
    c["rate"] = get(a.m, "rate");
    if (!a.cell.floor.empty()) {
      c["floor"] = a.cell.floor;
      c["floor_rate"] = floor_rate(a);
      double r = get(a.m, "rate") / floor_rate(a);
      c["ratio_to_floor"] = r;
    }
    if (is_peer(a.cell)) {
      std::string rc = relaybus_counterpart(a.cell, agg);
      c["relaybus_cell"] = rc;
      c["relaybus_rate"] = rate_of(rc);
      c["relaybus_over_peer"] = rate_of(rc) / get(a.m, "rate");
    }
    Json pu = Json::object();
    for (const char* k : {"stmts_pu", "stmts_top_pu", "stmts_top_per_call", "wal_bytes_pu", "wal_records_pu",
                          "wal_fpi_pu", "main_ins_pu", "main_upd_pu", "main_del_pu", "main_hot_share", "keyseq_upd_pu",
                          "keyseq_ins_pu", "keyseq_hot_share"})
      if (std::isfinite(get(a.m, k))) pu[k] = get(a.m, k);
    c["per_unit"] = pu;
    Json other = Json::object();
    for (const char* k : {"rss_kb",
                          "rss_anon_kb",
                          "call_p50_us",
                          "call_p99_us",
                          "lat_p50_ms",
                          "lat_p95_ms",
                          "lat_p99_ms",
                          "lat_max_ms",
                          "lat_negative",
                          "accepted_rate",
                          "delivered_rate",
                          "ex_lost",
                          "ex_dup",
                          "ex_order",
                          "ex_dead",
                          "spin_ms",
                          "cpu_busy",
                          "cpu_us_pu",
                          "dispatcher_cpu_share",
                          "empty_claims"})
      if (std::isfinite(get(a.m, k))) other[k] = get(a.m, k);
    c["other"] = other;
    cells.push(c);
  }
  cmp["cells"] = cells;
  write_file(in.out_dir + "/comparison.json", cmp.dump() + "\n");
  return md;
}

}  // namespace bench
