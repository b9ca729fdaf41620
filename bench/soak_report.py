#!/usr/bin/env python3
"""The report of bench/soak.sh: per minute memory, backlog, dead letters,
latency per handler kind, events published and delivered; exactness; the
memory verdict.

    soak_report.py --work WORK --out OUT

Reads OUT/samples.jsonl and OUT/env.json (written by soak.sh) and the raw
files in WORK: published.tsv (id, kind, t), notify.out (listen_client
--timestamps), http.log (soak_receiver.py), pulled.tsv (delivery_id,
event_id, t_pub, t_recv), pending.tsv and dead.tsv (handler, event_id).
Writes OUT/minutes.jsonl and OUT/report.md; prints the report's summary.

Latency is receipt wall time minus the publish wall time in the payload
("t", clock_timestamp() in the publishing statement, before its COMMIT), per
event published in that minute. "delivered" counts receipts in that minute. Receipts during the drain and
events published in the last fraction of a second count into the last minute.
"""
import argparse
import json
import math
import os
from collections import Counter, defaultdict

KINDS = ("notify", "http", "pull")
HANDLER = {k: "soak_" + k for k in KINDS}
TOP_FLAT_BOUND = 8192  # bytes: TopMemoryContext after warm-up vs the last minute
WARMUP_MINUTE = 2


def pct(values, p):
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(p / 100 * len(s)) - 1))]


def read_receipts(work):
    """kind -> list of (event_id, t_pub, t_recv)."""
    rec = {k: [] for k in KINDS}
    bad = Counter()
    with open(os.path.join(work, "notify.out"), encoding="utf-8") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            try:
                msg = json.loads(parts[1])
                recv = float(next(p[5:] for p in parts[2:] if p.startswith("recv=")))
                rec["notify"].append((int(msg["event_id"]), float(msg["payload"]["t"]), recv))
            except (IndexError, KeyError, ValueError, TypeError, StopIteration):
                bad["notify"] += 1
    with open(os.path.join(work, "http.log"), encoding="utf-8") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            try:
                rec["http"].append((int(parts[2]), float(parts[3]), float(parts[0])))
            except (IndexError, ValueError):
                bad["http"] += 1
    with open(os.path.join(work, "pulled.tsv"), encoding="utf-8") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            try:
                rec["pull"].append((int(parts[1]), float(parts[2]), float(parts[3])))
            except (IndexError, ValueError):
                bad["pull"] += 1
    return rec, bad


def read_pairs(path):
    out = defaultdict(set)
    with open(path, encoding="utf-8") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) >= 2 and parts[1] != "\\N":
                out[parts[0]].add(int(parts[1]))
    return out


def kb(b):
    return "" if b is None else f"{b / 1024:,.1f}"


def ms(x):
    return "" if x is None else f"{x:.1f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    with open(os.path.join(a.out, "env.json"), encoding="utf-8") as f:
        env = json.load(f)
    samples = []
    with open(os.path.join(a.out, "samples.jsonl"), encoding="utf-8") as f:
        for line in f:
            if line.strip():
                samples.append(json.loads(line))
    t0, minutes = env["t0"], env["minutes"]

    published = {k: {} for k in KINDS}  # kind -> id -> t
    with open(os.path.join(a.work, "published.tsv"), encoding="utf-8") as f:
        for line in f:
            i, kind, t = line.rstrip("\n").split("\t")
            published[kind][int(i)] = float(t)
    rec, bad = read_receipts(a.work)
    pending = read_pairs(os.path.join(a.work, "pending.tsv"))
    dead = read_pairs(os.path.join(a.work, "dead.tsv"))

    # The last second of publishing and the drain count into the last minute.
    def minute_of(t):
        return min(max(int((t - t0) // 60) + 1, 1), minutes)

    # ---- per minute latency and counts
    lat = {k: defaultdict(list) for k in KINDS}
    delivered_in = {k: Counter() for k in KINDS}
    published_in = {k: Counter() for k in KINDS}
    for k in KINDS:
        for t in published[k].values():
            published_in[k][minute_of(t)] += 1
        for _, t_pub, t_recv in rec[k]:
            lat[k][minute_of(t_pub)].append((t_recv - t_pub) * 1000.0)
            delivered_in[k][minute_of(t_recv)] += 1

    by_label = {str(s["minute"]): s for s in samples}
    rows = []
    labels = [str(m) for m in range(0, minutes + 1)] + ["drained"]
    for label in labels:
        s = by_label.get(label)
        if s is None:
            continue
        m = int(label) if label.isdigit() else None
        st = s.get("state") or {}
        row = {
            "minute": label,
            "pid": s.get("pid"),
            "top_used": s.get("top_used"),
            "top_total": s.get("top_total"),
            "grand_used": s.get("grand_used"),
            "grand_total": s.get("grand_total"),
            "rss_anon_kb": s.get("rss_anon_kb"),
            "vm_rss_kb": s.get("vm_rss_kb"),
            "backlog": {k: (st.get("backlog") or {}).get(HANDLER[k]) for k in KINDS},
            "dead": st.get("dead"),
        }
        if m is not None and m >= 1:
            for k in KINDS:
                v = lat[k].get(m, [])
                row[k] = {
                    "published": published_in[k].get(m, 0),
                    "delivered": delivered_in[k].get(m, 0),
                    "p50_ms": pct(v, 50),
                    "p99_ms": pct(v, 99),
                    "max_ms": max(v) if v else None,
                }
        rows.append(row)
    with open(os.path.join(a.out, "minutes.jsonl"), "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")

    # ---- exactness per kind
    exact = {}
    for k in KINDS:
        expected = set(published[k])
        counts = Counter(e for e, _, _ in rec[k])
        got = set(counts)
        pend = pending.get(HANDLER[k], set())
        dd = dead.get(HANDLER[k], set())
        exact[k] = {
            "published": len(expected),
            "delivered": len(got & expected),
            "lost": len(expected - got - pend - dd),
            "duplicated": sum(c - 1 for c in counts.values() if c > 1),
            "pending": len(pend),
            "dead": len(dd),
            "unexpected": len(got - expected),
            "unparsable": bad.get(k, 0),
        }
    all_lat = {k: [(r - p) * 1000.0 for _, p, r in rec[k]] for k in KINDS}

    # ---- memory verdict
    minute_rows = {r["minute"]: r for r in rows}
    warm = minute_rows.get(str(WARMUP_MINUTE))
    last = minute_rows.get(str(minutes))
    if minutes <= WARMUP_MINUTE or not warm or not last or warm["top_used"] is None or last["top_used"] is None:
        verdict, why = "n/a", f"needs more than {WARMUP_MINUTE} minutes with both samples"
    else:
        d = last["top_used"] - warm["top_used"]
        same_pid = warm["pid"] == last["pid"]
        flat = abs(d) <= TOP_FLAT_BOUND and same_pid
        verdict = "yes" if flat else "no"
        why = (f"TopMemoryContext used {warm['top_used']:,} B after minute {WARMUP_MINUTE}, "
               f"{last['top_used']:,} B after minute {minutes} ({d:+,} B; bound {TOP_FLAT_BOUND:,} B)")
        if warm["grand_used"] is not None and last["grand_used"] is not None:
            why += f"; all contexts {last['grand_used'] - warm['grand_used']:+,} B"
        if warm["rss_anon_kb"] is not None and last["rss_anon_kb"] is not None:
            why += f"; RssAnon {last['rss_anon_kb'] - warm['rss_anon_kb']:+,} kB"
        if not same_pid:
            why += f"; the dispatcher changed (pid {warm['pid']} -> {last['pid']})"

    # ---- report.md
    md = []
    md.append(f"# Soak: {minutes} min at {env['rate_per_kind']} events/s per kind\n")
    md.append(f"Build: `{env['build_ref']}` ({env['pg_config']}), relaybus.so sha256 "
              f"`{env['relaybus_so_sha256'][:16]}...`; harness `{env['harness_ref'][:7]}`; "
              f"{env['nproc']} cores, load at the end {env['load_at_end']}.\n")
    md.append("Handlers: `soak_notify` (notify, fire mode, one LISTEN client), `soak_http` (http, envelope, "
              "local receiver answering 200), `soak_pull` (pull, one consumer claiming up to 500 every "
              "20 ms and acking in the same transaction). One keyed event per publishing transaction "
              "(1,000 keys), pgbench -R per kind.\n")
    md.append("Memory: the dispatcher's `TopMemoryContext` used bytes and the grand total (used) of all its "
              "memory contexts (pg_log_backend_memory_contexts), /proc RssAnon and VmRSS (kB). Minute 0 "
              "is before publishing, `drained` after the backlog drained. Backlog: rows in "
              "relay.deliveries per handler. Latency (ms): receipt minus the publish wall time in the "
              "payload, of the events published in that minute; pub/dlv: events published / received "
              "in that minute.\n")
    head = ("| min | Top used | all used | RssAnon kB | VmRSS kB | backlog n/h/p | dead | "
            "notify p50/p99 | http p50/p99 | pull p50/p99 | pub n/h/p | dlv n/h/p |")
    md.append(head)
    md.append("|" + " ---: |" * (head.count("|") - 1))
    for r in rows:
        b = r["backlog"]
        cells = [r["minute"], f"{r['top_used']:,}" if r["top_used"] is not None else "?",
                 f"{r['grand_used']:,}" if r["grand_used"] is not None else "?",
                 f"{r['rss_anon_kb']:,}" if r["rss_anon_kb"] is not None else "?",
                 f"{r['vm_rss_kb']:,}" if r["vm_rss_kb"] is not None else "?",
                 "/".join(str(b[k]) for k in KINDS), str(r["dead"])]
        for k in KINDS:
            v = r.get(k)
            cells.append(f"{ms(v['p50_ms'])} / {ms(v['p99_ms'])}" if v else "")
        for key in ("published", "delivered"):
            cells.append("/".join(str(r[k][key]) for k in KINDS) if r.get("notify") else "")
        md.append("| " + " | ".join(cells) + " |")
    md.append("")
    md.append("Whole run, latency (ms) over every receipt:\n")
    md.append("| kind | receipts | p50 | p99 | max |")
    md.append("| --- | ---: | ---: | ---: | ---: |")
    for k in KINDS:
        v = all_lat[k]
        md.append(f"| {k} | {len(v):,} | {ms(pct(v, 50))} | {ms(pct(v, 99))} | {ms(max(v) if v else None)} |")
    md.append("")
    md.append("Exactness per kind:\n")
    md.append("| kind | published | delivered | lost | duplicated | pending | dead | unexpected | unparsable |")
    md.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for k in KINDS:
        e = exact[k]
        md.append(f"| {k} | {e['published']:,} | {e['delivered']:,} | {e['lost']} | {e['duplicated']} | "
                  f"{e['pending']} | {e['dead']} | {e['unexpected']} | {e['unparsable']} |")
    tot = {f: sum(exact[k][f] for k in KINDS) for f in ("lost", "duplicated", "dead", "pending", "unexpected")}
    exact_line = (f"Exactness: lost {tot['lost']}, duplicated {tot['duplicated']}, dead {tot['dead']} "
                  f"(pending {tot['pending']}, unexpected {tot['unexpected']})")
    verdict_line = f"Memory flat after warm-up: {verdict} ({why})"
    md.append("")
    md.append(exact_line + "\n")
    md.append(verdict_line)
    with open(os.path.join(a.out, "report.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(md) + "\n")
    with open(os.path.join(a.out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump({"exactness": exact, "memory_flat": verdict, "memory_why": why,
                   "latency_ms": {k: {"p50": pct(all_lat[k], 50), "p99": pct(all_lat[k], 99)} for k in KINDS}},
                  f, indent=1)
    print("\n".join(md[4:]))
    return 0 if tot["lost"] == 0 and tot["duplicated"] == 0 and tot["unexpected"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
