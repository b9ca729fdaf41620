# Reads a topic dumped by kafka_consume (kcat -J lines) and the publishers'
# committed events (pub_log: "id|key" lines) and prints name=value facts:
#   messages, missing (committed, never arrived), extra (arrived, not
#   committed), duplicates (copies beyond the first), dup_ids (those event
#   ids, comma separated), keys_in_one_partition, out_of_order (per key, in
#   partition order, copies of the previous message collapsed: a message that
#   is not the next seq of its key), and for pipelined keys (a run of a key
#   in flight at once may be produced again whole):
#   out_of_order_runs (per key, a message that is neither the next seq nor a
#   step back to an earlier seq from which the key then goes on one by one:
#   only repeats of a contiguous run pass), rewinds (such steps back),
#   max_rewind (the longest: how many seqs one repeated), max_dups_per_key.
import json
import sys


def main(topic_file, pub_file):
    pub = {}
    for line in open(pub_file):
        eid, _, key = line.rstrip("\n").partition("|")
        pub[int(eid)] = key or None
    msgs = [json.loads(l) for l in open(topic_file) if l.strip()]
    msgs.sort(key=lambda m: (m["partition"], m["offset"]))
    seen, parts, last_seq, out_of_order = {}, {}, {}, 0
    expect, top, dups_of = {}, {}, {}
    out_of_order_runs, rewinds, max_rewind = 0, 0, 0
    for m in msgs:
        h = dict(zip(m["headers"][0::2], m["headers"][1::2])) if m.get("headers") else {}
        eid = int(h["relay-event-id"])
        seen[eid] = seen.get(eid, 0) + 1
        key = m.get("key")
        if key is None:
            continue
        parts.setdefault(key, set()).add(m["partition"])
        seq = int(h["relay-seq"])
        prev = last_seq.get(key, 0)
        if seq != prev + 1 and seq != prev:
            out_of_order += 1
        last_seq[key] = max(prev, seq)
        nxt, hi = expect.get(key, 1), top.get(key, 0)
        if seq < nxt:
            rewinds += 1
            max_rewind = max(max_rewind, hi - seq + 1)
        elif seq > nxt:
            out_of_order_runs += 1
        if seen[eid] > 1:
            dups_of[key] = dups_of.get(key, 0) + 1
        expect[key] = seq + 1
        top[key] = max(hi, seq)
    dups = sorted(e for e, c in seen.items() if c > 1)
    print("messages=%d" % len(msgs))
    print("missing=%d" % len(set(pub) - set(seen)))
    print("extra=%d" % len(set(seen) - set(pub)))
    print("duplicates=%d" % sum(c - 1 for c in seen.values()))
    print("dup_ids=%s" % ",".join(str(e) for e in dups))
    print("keys_in_one_partition=%s" % all(len(p) == 1 for p in parts.values()))
    print("out_of_order=%d" % out_of_order)
    print("out_of_order_runs=%d" % out_of_order_runs)
    print("rewinds=%d" % rewinds)
    print("max_rewind=%d" % max_rewind)
    print("max_dups_per_key=%d" % max(dups_of.values(), default=0))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
