"""Checks what LISTEN clients received against what was published.

    python3 deliveries.py --published PUB [--rolled-back RB] OUT [OUT...]

PUB: one published event per line, "event_id|key" (empty key = unkeyed), as
written by `psql -At -c "SELECT id, key FROM pub_log"`: the events whose
transactions committed. RB: event ids (one per line) of rolled-back publishes.
OUT: the stdout of listen_client runs ("PID<TAB>JSON[<TAB>name=value...]").

Prints "name=value" lines for the test to assert on:

  lines               notification lines read
  distinct            distinct event ids received
  published           committed events
  missing             committed events never received (missing_ids: the first 20)
  extra               received event ids that were never committed
  dups                extra copies (lines - distinct)
  dups_same_sender    extra copies sent by the same backend pid that sent the id
                      before (a crash gives the dispatcher a new pid, so
                      duplicates across a crash have different senders)
  key_mismatch        notifications whose key differs from the published key
  order_violations    per client run and key, a seq smaller than the key's
                      previous seq in receive order
  seq_repeats         per client run and key, the same seq again
  seq_gap_keys        keys whose received seqs are not exactly 1..(events of the key)
  rolled_back_seen    rolled-back event ids that were received
  bad_lines           lines that are not PID<TAB>JSON
  by_ref              notifications sent by reference ("ref": true)
"""

import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--published", required=True)
    ap.add_argument("--rolled-back")
    ap.add_argument("outs", nargs="+")
    a = ap.parse_args()

    published = {}
    with open(a.published) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            eid, _, key = line.partition("|")
            published[int(eid)] = key if key != "" else None
    rolled_back = set()
    if a.rolled_back:
        with open(a.rolled_back) as f:
            rolled_back = {int(x) for x in f.read().split()}

    lines = bad = by_ref = key_mismatch = 0
    order_violations = seq_repeats = dups_same_sender = 0
    seen = {}  # event id -> set of sender pids
    copies = 0
    seqs_by_key = {}
    for path in a.outs:
        last_seq = {}
        with open(path) as f:
            for raw in f:
                raw = raw.rstrip("\n")
                if not raw:
                    continue
                parts = raw.split("\t")
                try:
                    pid = int(parts[0])
                    msg = json.loads(parts[1])
                    eid = int(msg["event_id"])
                except (ValueError, IndexError, KeyError, TypeError):
                    bad += 1
                    continue
                lines += 1
                if msg.get("ref"):
                    by_ref += 1
                key, seq = msg.get("key"), msg.get("seq")
                if eid in published and published[eid] != key:
                    key_mismatch += 1
                if eid in seen:
                    copies += 1
                    if pid in seen[eid]:
                        dups_same_sender += 1
                    seen[eid].add(pid)
                else:
                    seen[eid] = {pid}
                if key is not None and seq is not None:
                    prev = last_seq.get(key)
                    if prev is not None:
                        if seq < prev:
                            order_violations += 1
                        elif seq == prev:
                            seq_repeats += 1
                    last_seq[key] = seq
                    seqs_by_key.setdefault(key, set()).add(seq)

    per_key = {}
    for eid, key in published.items():
        if key is not None:
            per_key[key] = per_key.get(key, 0) + 1
    seq_gap_keys = sum(1 for k, n in per_key.items() if seqs_by_key.get(k, set()) != set(range(1, n + 1)))
    missing = sorted(set(published) - set(seen))
    extra = sorted(set(seen) - set(published))

    out = {
        "lines": lines,
        "distinct": len(seen),
        "published": len(published),
        "missing": len(missing),
        "missing_ids": ",".join(map(str, missing[:20])),
        "extra": len(extra),
        "extra_ids": ",".join(map(str, extra[:20])),
        "dups": copies,
        "dups_same_sender": dups_same_sender,
        "key_mismatch": key_mismatch,
        "order_violations": order_violations,
        "seq_repeats": seq_repeats,
        "seq_gap_keys": seq_gap_keys,
        "rolled_back_seen": len(rolled_back & set(seen)),
        "bad_lines": bad,
        "by_ref": by_ref,
    }
    for k, v in out.items():
        print(f"{k}={v}")


if __name__ == "__main__":
    sys.exit(main())
