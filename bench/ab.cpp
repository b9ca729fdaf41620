// A/B statistics and reports: see ab.hpp and bench/README.md ("A/B and the gate").
//
// Per cell and pair (one base and one candidate sample, run back to back in
// ABBA order) the ratio candidate/base of the cell's main metric. The interval
// is a t-interval on the log ratios of the usable pairs: pairs cancel the
// slow drift of a shared machine, logs make the ratio symmetric (x2 and /2 are
// equally far from 1), and with 3 pairs a bootstrap would have only 10 distinct
// resamples, too few to mean anything.

#include "ab.hpp"

#include <map>
#include <set>

namespace bench {

namespace {

// Two-sided 95 % quantile of Student's t for df = 1..30 (then the normal's 1.96 is close enough).
double t975(int df) {
  static const double t[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                             2.201,  2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
                             2.080,  2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042};
  if (df < 1) return NAN;
  return df <= 30 ? t[df - 1] : 1.96;
}

double get(const std::map<std::string, double>& m, const std::string& k) {
  auto it = m.find(k);
  return it == m.end() ? NAN : it->second;
}

// The metric a cell is judged on: throughput, or for mixed cells (paced publishing, so the
// rate is fixed by design) the delivery latency p99, where lower is better.
struct MainMetric {
  const char* key;
  const char* label;
  bool lower_better;
};
MainMetric main_metric(const Cell& c) {
  if (c.group == Group::Mixed) return {"lat_p99_ms", "latency p99 ms", true};
  if (c.group == Group::Dispatch) return {"rate", "deliveries/s", false};
  return {"rate", "events/s", false};
}

bool exactness_failed(const SampleResult& s) {
  for (const std::string& w : s.invalid)
    if (starts_with(w, "exactness:") || starts_with(w, "publish:")) return true;
  return false;
}

struct Pair {
  int no = 0;
  std::string first;  // the side that ran first in this pair
  const SampleResult* base = nullptr;
  const SampleResult* cand = nullptr;
  bool used = false;        // counts toward the ratio
  bool comparable = false;  // both samples valid: counters are judged (noise does not move them)
  std::string discarded;    // why the pair does not count toward the ratio
  double ratio = NAN;
};

// Geometric mean of ratios and its 95 % t-interval on the logs (NAN where undefined).
struct Interval {
  double ratio = NAN, lo = NAN, hi = NAN;
  int n = 0;
};
Interval log_t_interval(const std::vector<double>& logs) {
  Interval iv;
  iv.n = int(logs.size());
  if (logs.empty()) return iv;
  double mean = 0;
  for (double x : logs) mean += x;
  mean /= double(logs.size());
  iv.ratio = std::exp(mean);
  if (logs.size() >= 2) {
    double ss = 0;
    for (double x : logs) ss += (x - mean) * (x - mean);
    double half = t975(iv.n - 1) * std::sqrt(ss / double(iv.n - 1)) / std::sqrt(double(iv.n));
    iv.lo = std::exp(mean - half);
    iv.hi = std::exp(mean + half);
  }
  return iv;
}

struct CellResult {
  Cell cell;
  MainMetric metric{};
  std::vector<Pair> pairs;
  int used = 0, discarded = 0;
  double base_median = NAN, cand_median = NAN;
  double ratio = NAN, lo = NAN, hi = NAN;  // geometric mean ratio candidate/base and its 95 % CI
  std::string verdict;
  // The same over every pair with two valid samples, noise rule off: shown next to the
  // verdict so a reader sees what the noise rule changed; never used for the verdict or gate.
  Interval unfiltered;
  std::vector<std::string> gate_failures;
  std::map<std::string, double> base_counter, cand_counter;  // medians over comparable pairs
  std::map<std::string, double> worst_excess;                // max over pairs of cand - allowed (> 0 fails)
};

std::string fmt_ratio(double r) { return std::isfinite(r) ? strf("%.3f", r) : "–"; }

// Compact counter value: enough digits for per-unit numbers below 1.
std::string cnum(double v) {
  if (!std::isfinite(v)) return "–";
  if (std::fabs(v) >= 100) return num(v);
  if (std::fabs(v) >= 1) return strf("%.2f", v);
  return strf("%.4f", v);
}

CellResult analyse(const Cell& cell, const std::vector<const SampleResult*>& samples, double quiet_spin,
                   const AbRules& rules, const std::vector<GateCounter>& counters) {
  CellResult cr;
  cr.cell = cell;
  cr.metric = main_metric(cell);
  // A sample repeated with a larger backlog replaces the first: the last sample of a side in a pair counts.
  std::map<int, Pair> by_pair;
  for (const SampleResult* s : samples) {
    Pair& p = by_pair[s->pair];
    p.no = s->pair;
    if (p.first.empty()) p.first = s->side;
    (s->side == "base" ? p.base : p.cand) = s;
  }
  std::vector<double> logs, all_logs, base_vals, cand_vals;
  for (auto& kv : by_pair) {
    Pair p = kv.second;
    double noisy_limit = rules.noise_factor * quiet_spin;
    if (p.base == nullptr || p.cand == nullptr) {
      p.discarded = "a side is missing (the run stopped)";
    } else {
      p.comparable = p.base->valid && p.cand->valid;
      double bs = get(p.base->m, "spin_ms"), cs = get(p.cand->m, "spin_ms");
      double b = get(p.base->m, cr.metric.key), c = get(p.cand->m, cr.metric.key);
      if (!p.base->valid || !p.cand->valid) {
        p.discarded = std::string("invalid ") + (!p.base->valid ? "base" : "candidate") + " sample";
      } else if (!(b > 0) || !(c > 0)) {
        p.discarded = "no " + std::string(cr.metric.label) + " on a side";
      } else {
        p.ratio = c / b;
        all_logs.push_back(std::log(p.ratio));
        if (!(bs <= noisy_limit) || !(cs <= noisy_limit)) {
          p.discarded = strf("noisy: spin base %.0f / candidate %.0f ms, limit %.0f ms (%.2fx the quietest %.0f ms)",
                             bs, cs, noisy_limit, rules.noise_factor, quiet_spin);
        } else {
          p.used = true;
          logs.push_back(std::log(p.ratio));
          base_vals.push_back(b);
          cand_vals.push_back(c);
        }
      }
    }
    if (p.used)
      cr.used++;
    else
      cr.discarded++;
    cr.pairs.push_back(p);
  }
  cr.base_median = median(base_vals);
  cr.cand_median = median(cand_vals);

  size_t n = logs.size();
  Interval iv = log_t_interval(logs);
  cr.ratio = iv.ratio;
  cr.lo = iv.lo;
  cr.hi = iv.hi;
  cr.unfiltered = log_t_interval(all_logs);
  if (int(n) < rules.min_pairs) {
    cr.verdict = "inconclusive";
  } else {
    // "better" = candidate ahead: higher rate, or lower latency.
    bool up = cr.lo > 1.0 && cr.ratio >= 1.0 + rules.effect_threshold;
    bool down = cr.hi < 1.0 && cr.ratio <= 1.0 / (1.0 + rules.effect_threshold);
    bool better = cr.metric.lower_better ? down : up;
    bool worse = cr.metric.lower_better ? up : down;
    cr.verdict = better ? "faster" : worse ? "slower" : "no difference";
  }

  // Counters per pair (noise does not change them, so every pair with two valid samples counts).
  std::map<std::string, std::vector<double>> bv, cv;
  for (const Pair& p : cr.pairs) {
    if (!p.comparable) continue;
    for (const GateCounter& g : counters) {
      double b = get(p.base->m, g.key), c = get(p.cand->m, g.key);
      if (!std::isfinite(b) || !std::isfinite(c)) continue;
      bv[g.key].push_back(b);
      cv[g.key].push_back(c);
      double excess = c - (b * (1 + g.rel) + g.abs);
      auto it = cr.worst_excess.find(g.key);
      if (it == cr.worst_excess.end() || excess > it->second) cr.worst_excess[g.key] = excess;
      if (excess > 0)
        cr.gate_failures.push_back(strf("%s pair %d: %s candidate %s > base %s x %.2f + %g", cell.name.c_str(), p.no,
                                        g.label, cnum(c).c_str(), cnum(b).c_str(), 1 + g.rel, g.abs));
    }
  }
  for (auto& kv : bv) cr.base_counter[kv.first] = median(kv.second);
  for (auto& kv : cv) cr.cand_counter[kv.first] = median(kv.second);
  for (const SampleResult* s : samples)
    if (exactness_failed(*s))
      cr.gate_failures.push_back(
          strf("%s pair %d (%s): %s", cell.name.c_str(), s->pair, s->side.c_str(), s->invalid.front().c_str()));
  int comparable = 0;
  for (const Pair& p : cr.pairs) comparable += p.comparable;
  if (comparable == 0) cr.gate_failures.push_back(cell.name + ": no pair with two valid samples, nothing to judge");
  if (cr.used >= rules.min_pairs) {
    bool regressed = cr.metric.lower_better ? cr.lo > 1.0 / rules.gate_rate_floor : cr.hi < rules.gate_rate_floor;
    if (regressed)
      cr.gate_failures.push_back(strf("%s: %s ratio %.3f, 95%% CI [%.3f, %.3f] entirely beyond the gate's %.2f",
                                      cell.name.c_str(), cr.metric.label, cr.ratio, cr.lo, cr.hi,
                                      cr.metric.lower_better ? 1.0 / rules.gate_rate_floor : rules.gate_rate_floor));
  }
  return cr;
}

}  // namespace

const std::vector<GateCounter>& gate_counters() {
  // Statements and rows are exact counts; the per-unit values still move a little because
  // calls in flight at the window's edges and the dispatchers' idle polls are counted too,
  // hence a small slack. WAL bytes and records also carry the full-page images written after
  // the CHECKPOINT before each sample, and background writes (autovacuum, the dispatchers):
  // 5 % plus a small absolute slack.
  static const std::vector<GateCounter> c = {
      {"stmts_pu", "statements/unit", 0.02, 0.002},       {"wal_bytes_pu", "WAL bytes/unit", 0.05, 16},
      {"wal_records_pu", "WAL records/unit", 0.05, 0.02}, {"main_upd_pu", "rows updated/unit", 0.02, 0.005},
      {"main_del_pu", "rows deleted/unit", 0.02, 0.005},  {"keyseq_upd_pu", "key_seqs updated/unit", 0.02, 0.005},
  };
  return c;
}

AbOutcome write_ab_reports(const AbInput& in) {
  const AbRules& rules = in.rules;
  const std::vector<GateCounter>& counters = gate_counters();
  std::vector<std::string> order;
  std::map<std::string, std::vector<const SampleResult*>> by_cell;
  double quiet = NAN;
  for (const SampleResult& s : in.samples) {
    if (!by_cell.count(s.cell.name)) order.push_back(s.cell.name);
    by_cell[s.cell.name].push_back(&s);
    double sp = get(s.m, "spin_ms");
    if (std::isfinite(sp) && (!std::isfinite(quiet) || sp < quiet)) quiet = sp;
  }
  std::vector<CellResult> results;
  AbOutcome out;
  for (const std::string& n : order) {
    results.push_back(analyse(by_cell[n].front()->cell, by_cell[n], quiet, rules, counters));
    for (const std::string& f : results.back().gate_failures) out.gate_failures.push_back(f);
  }
  out.gate_pass = out.gate_failures.empty();

  const Json* ab = in.env.find("ab");
  auto side_desc = [&](const char* side) -> std::string {
    const Json* s = ab ? ab->find(side) : nullptr;
    if (s == nullptr) return "?";
    auto f = [&](const char* k) {
      const Json* v = s->find(k);
      return v && v->type() == Json::Str ? v->str() : std::string("?");
    };
    return strf("`%s` = %.12s (relaybus.so sha256 %.12s, without debug info and build-id %.12s)", f("ref").c_str(),
                f("commit").c_str(), f("relaybus_so_sha256").c_str(), f("relaybus_so_sha256_code").c_str());
  };
  std::vector<double> spins;
  int invalid = 0;
  for (const SampleResult& s : in.samples) {
    if (std::isfinite(get(s.m, "spin_ms"))) spins.push_back(get(s.m, "spin_ms"));
    invalid += !s.valid;
  }
  std::sort(spins.begin(), spins.end());

  std::string md;
  md += "# relaybus A/B " + in.run_id + "\n\n";
  md += "Base " + side_desc("base") + "; candidate " + side_desc("candidate") + ".\n";
  md += strf(
      "Run: `%s`, %.1f minutes, %zu samples (%d invalid), %d pairs per cell in ABBA order, one cluster per "
      "build (same settings), only one running at a time. CPU spin before each sample: %s to %s ms "
      "(median %s).\n\n",
      in.args.c_str(), in.minutes, in.samples.size(), invalid, in.pairs,
      num(spins.empty() ? NAN : spins.front()).c_str(), num(spins.empty() ? NAN : spins.back()).c_str(),
      num(median(spins)).c_str());
  md += strf(
      "Rules: ratio = candidate / base of the cell's metric (events/s, deliveries/s; latency p99 for mixed "
      "cells, where a ratio below 1 is better), geometric mean over the usable pairs, 95 %% CI = t-interval on "
      "the pairs' log ratios. A pair is discarded (and listed) when a sample is invalid or either spin is over "
      "%.2fx the run's quietest (%s ms). Verdict: \"faster\"/\"slower\" when the whole CI is on one side of 1.0 "
      "and the ratio is beyond %.0f %%; \"no difference\" otherwise; \"inconclusive\" with fewer than %d usable "
      "pairs.\n\n",
      rules.noise_factor, num(quiet).c_str(), 100 * rules.effect_threshold, rules.min_pairs);

  md += "## Ratios\n\n";
  md +=
      "| cell | metric | base median | candidate median | ratio | 95% CI | verdict | pairs used | discarded "
      "| noise rule off: ratio [95% CI] (pairs) |\n";
  md += "| --- | --- | ---: | ---: | ---: | --- | --- | ---: | ---: | --- |\n";
  for (const CellResult& r : results) {
    int prec = r.metric.lower_better ? 2 : 0;
    const Interval& u = r.unfiltered;
    md += strf("| %s | %s | %s | %s | %s | %s | **%s** | %d | %d | %s %s (%d) |\n", r.cell.name.c_str(), r.metric.label,
               num(r.base_median, prec).c_str(), num(r.cand_median, prec).c_str(), fmt_ratio(r.ratio).c_str(),
               std::isfinite(r.lo) ? strf("[%.3f, %.3f]", r.lo, r.hi).c_str() : "–", r.verdict.c_str(), r.used,
               r.discarded, fmt_ratio(u.ratio).c_str(),
               std::isfinite(u.lo) ? strf("[%.3f, %.3f]", u.lo, u.hi).c_str() : "–", u.n);
  }
  md +=
      "\nThe last column is for reading only: the same interval over every pair with two valid samples, noisy "
      "ones included. Verdicts and the gate use the pairs that pass the noise rule.\n";

  md += "\n## Counters per unit (base → candidate, medians over pairs with two valid samples)\n\n";
  md +=
      "Unit: an event (publish, mixed) or a delivery (dispatch). Tolerance per pair: candidate ≤ base × (1 + rel) "
      "+ abs, with";
  for (size_t i = 0; i < counters.size(); i++)
    md += strf("%s %s %.0f %% + %g", i ? ";" : "", counters[i].label, 100 * counters[i].rel, counters[i].abs);
  md += ".\n\n| cell |";
  for (const GateCounter& g : counters) md += strf(" %s |", g.label);
  md += " counters |\n| --- |";
  for (size_t i = 0; i < counters.size(); i++) md += " ---: |";
  md += " --- |\n";
  for (const CellResult& r : results) {
    md += "| " + r.cell.name + " |";
    for (const GateCounter& g : counters)
      md += " " + cnum(get(r.base_counter, g.key)) + " → " + cnum(get(r.cand_counter, g.key)) + " |";
    bool counter_fail = false;
    for (auto& kv : r.worst_excess) counter_fail |= kv.second > 0;
    md += counter_fail ? " **over tolerance** |\n" : " within tolerance |\n";
  }

  md += "\n## Pairs\n\n| cell | pair | order | base | candidate | ratio | spin base / candidate ms | used |\n";
  md += "| --- | ---: | --- | ---: | ---: | ---: | --- | --- |\n";
  for (const CellResult& r : results)
    for (const Pair& p : r.pairs) {
      int prec = r.metric.lower_better ? 2 : 0;
      double b = p.base ? get(p.base->m, r.metric.key) : NAN, c = p.cand ? get(p.cand->m, r.metric.key) : NAN;
      md += strf("| %s | %d | %s | %s | %s | %s | %s / %s | %s |\n", r.cell.name.c_str(), p.no,
                 p.first == "base" ? "base, candidate" : "candidate, base", num(b, prec).c_str(), num(c, prec).c_str(),
                 fmt_ratio(p.ratio).c_str(), num(p.base ? get(p.base->m, "spin_ms") : NAN).c_str(),
                 num(p.cand ? get(p.cand->m, "spin_ms") : NAN).c_str(),
                 p.used ? "yes" : ("**discarded**: " + p.discarded).c_str());
    }

  md += "\n## Invalid samples\n\n";
  if (invalid == 0) md += "None.\n";
  for (const SampleResult& s : in.samples)
    for (const std::string& w : s.invalid)
      md += strf("- `%s` pair %d %s: %s\n", s.cell.name.c_str(), s.pair, s.side.c_str(), w.c_str());

  if (in.gate) {
    md += "\n## Gate: " + std::string(out.gate_pass ? "PASS" : "FAIL") + "\n\n";
    md += strf(
        "Fails on: a counter over its tolerance in any pair; any sample failing exactness (lost, duplicated, "
        "out of order, dead, wrong row count); a cell without a pair of two valid samples; a rate whose whole "
        "95 %% CI is below %.2f (latency: above %.2f). Rate verdicts are reported, not gated, otherwise.\n\n",
        rules.gate_rate_floor, 1.0 / rules.gate_rate_floor);
    for (const std::string& f : out.gate_failures) md += "- " + f + "\n";
    if (out.gate_pass) md += "Every counter within tolerance in every pair, every sample exact.\n";
  }
  md += "\nPer-sample details (side, pair, every metric, statements, exactness) are in samples.jsonl.\n";
  write_file(in.out_dir + "/report.md", md);
  out.markdown = md;

  Json cmp = Json::object();
  cmp["run_id"] = in.run_id;
  cmp["mode"] = "ab";
  if (ab) cmp["ab"] = *ab;
  Json rj = Json::object();
  rj["ratio"] = "candidate / base, geometric mean over usable pairs";
  rj["ci"] = "95 % t-interval on the log ratios of the usable pairs";
  rj["noise_factor"] = rules.noise_factor;
  rj["quietest_spin_ms"] = quiet;
  rj["effect_threshold"] = rules.effect_threshold;
  rj["min_pairs"] = rules.min_pairs;
  rj["gate_rate_floor"] = rules.gate_rate_floor;
  Json tol = Json::object();
  for (const GateCounter& g : counters) {
    Json t = Json::object();
    t["rel"] = g.rel;
    t["abs"] = g.abs;
    tol[g.key] = t;
  }
  rj["counter_tolerance"] = tol;
  cmp["rules"] = rj;
  Json cells = Json::array();
  for (const CellResult& r : results) {
    Json c = Json::object();
    c["cell"] = r.cell.name;
    c["group"] = group_name(r.cell.group);
    c["metric"] = r.metric.key;
    c["lower_is_better"] = r.metric.lower_better;
    c["base_median"] = r.base_median;
    c["candidate_median"] = r.cand_median;
    c["ratio"] = r.ratio;
    c["ci95_low"] = r.lo;
    c["ci95_high"] = r.hi;
    c["verdict"] = r.verdict;
    c["pairs_used"] = r.used;
    c["pairs_discarded"] = r.discarded;
    Json u = Json::object();
    u["ratio"] = r.unfiltered.ratio;
    u["ci95_low"] = r.unfiltered.lo;
    u["ci95_high"] = r.unfiltered.hi;
    u["pairs"] = r.unfiltered.n;
    c["noise_rule_off"] = u;
    Json pairs = Json::array();
    for (const Pair& p : r.pairs) {
      Json pj = Json::object();
      pj["pair"] = p.no;
      pj["first"] = p.first;
      pj["base"] = p.base ? get(p.base->m, r.metric.key) : NAN;
      pj["candidate"] = p.cand ? get(p.cand->m, r.metric.key) : NAN;
      pj["spin_base_ms"] = p.base ? get(p.base->m, "spin_ms") : NAN;
      pj["spin_candidate_ms"] = p.cand ? get(p.cand->m, "spin_ms") : NAN;
      pj["ratio"] = p.ratio;
      pj["used"] = p.used;
      if (!p.discarded.empty()) pj["discarded"] = p.discarded;
      pairs.push(pj);
    }
    c["pairs"] = pairs;
    Json cnt = Json::object();
    for (const GateCounter& g : counters) {
      Json e = Json::object();
      e["base"] = get(r.base_counter, g.key);
      e["candidate"] = get(r.cand_counter, g.key);
      e["worst_excess"] = get(r.worst_excess, g.key);
      cnt[g.key] = e;
    }
    c["counters_per_unit"] = cnt;
    Json gf = Json::array();
    for (const std::string& f : r.gate_failures) gf.push(f);
    c["gate_failures"] = gf;
    cells.push(c);
  }
  cmp["cells"] = cells;
  if (in.gate) {
    Json g = Json::object();
    g["pass"] = out.gate_pass;
    Json gf = Json::array();
    for (const std::string& f : out.gate_failures) gf.push(f);
    g["failures"] = gf;
    cmp["gate"] = g;
  }
  write_file(in.out_dir + "/comparison.json", cmp.dump() + "\n");
  return out;
}

}  // namespace bench
