"""Checks what the HTTP receiver got against what was published to relay_outbox.

    python3 mongo_check.py --receiver PORT --path /a --published PUB [--published PUB2 ...] [--secret whsec_...]

PUB: one JSON object per line, {"payload", "key"?} (mongo_preload.py prints
them; tests write them for `relaybus-mongo publish`). Payloads are distinct.
Every line of one file was published after the one before it (one publisher).
Prints name=value lines:

  requests         requests received on the path
  distinct         distinct webhook-ids
  dups             requests beyond the first per webhook-id
  published        events published
  missing          published payloads never received
  extra            received payloads never published
  reissued         payloads received under more than one delivery id (sequenced twice)
  id_reuse         delivery ids received with more than one payload
  seq_reuse        (key, seq) pairs received with more than one payload
  order_violations per key, a seq lower than the key's previous one in receive order
  first_order_violations  those whose seq had not arrived before: a first delivery
                   out of key order (the rest are repeats of a run delivered
                   again after a lease loss, which at least once allows)
  order_sample     the first violations: key:previous>seq@request index#delivery id,
                   (repeat) when that seq had arrived before, else (first)
  seq_mismatch     envelopes whose key differs from the published one
  seq_gap_keys     keys whose received seqs are not exactly 1..(events of the key)
  publish_order    per publisher and key, an event with a lower seq than an earlier one
  bad_signature    requests whose webhook-signature does not verify (with --secret)
  envelope_errors  bodies that are not the envelope with the right id, webhook-id
                   without the "msg_mongo_" prefix, or no published_at
"""
import argparse
import json
import urllib.request


def canon(v):
    return json.dumps(v, sort_keys=True, separators=(",", ":"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--receiver", required=True)
    ap.add_argument("--path", required=True)
    ap.add_argument("--published", required=True, action="append")
    ap.add_argument("--secret")
    a = ap.parse_args()
    reqs = json.load(urllib.request.urlopen(f"http://127.0.0.1:{a.receiver}/_requests"))
    reqs = [r for r in reqs if r["path"] == a.path]
    pub = {}          # payload -> line
    publishers = []   # per file: [payload, ...] in publish order
    count_by_key = {}
    for fname in a.published:
        order = []
        with open(fname) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                p = json.loads(line)
                c = canon(p["payload"])
                pub[c] = p
                order.append(c)
                if "key" in p:
                    count_by_key[p["key"]] = count_by_key.get(p["key"], 0) + 1
        publishers.append(order)
    wh = None
    if a.secret:
        from standardwebhooks import Webhook
        wh = Webhook(a.secret)
    seen = {}
    ids_of_payload = {}
    payloads_of_id = {}
    payloads_of_seq = {}
    seq_of_payload = {}
    last_seq = {}
    got_seqs = {}
    order_violations = first_order_violations = seq_mismatch = bad_sig = env_err = 0
    order_sample = []  # "key:prev>seq@request#(repeat|first)" for the first violations
    for idx, r in enumerate(reqs):
        h = r["headers"]
        # webhook-id: "msg_mongo_<database>_<delivery id>" (docs/mongo.md)
        raw = h.get("webhook-id", "")
        num = raw.rpartition("_")[2]
        wid = int(num) if num.isdigit() else 0
        seen[wid] = seen.get(wid, 0) + 1
        try:
            body = json.loads(r["body"])
            if (body.get("id") != wid or not raw.startswith("msg_mongo_")
                    or not isinstance(body.get("published_at"), str) or not body["published_at"].endswith("Z")):
                env_err += 1
        except Exception:
            env_err += 1
            continue
        if wh is not None:
            try:
                wh.verify(r["body"], {"webhook-id": h["webhook-id"], "webhook-timestamp": h["webhook-timestamp"],
                                      "webhook-signature": h["webhook-signature"]})
            except Exception:
                bad_sig += 1
        c = canon(body.get("payload"))
        ids_of_payload.setdefault(c, set()).add(wid)
        payloads_of_id.setdefault(wid, set()).add(c)
        p = pub.get(c)
        key = body.get("key")
        if p is not None and p.get("key") != key:
            seq_mismatch += 1
        if key is not None:
            s = body.get("seq")
            payloads_of_seq.setdefault((key, s), set()).add(c)
            seq_of_payload[c] = s
            if key in last_seq and s < last_seq[key]:
                order_violations += 1
                kind = "repeat" if s in got_seqs.get(key, set()) else "first"
                first_order_violations += kind == "first"
                if len(order_sample) < 8:
                    order_sample.append(f"{key}:{last_seq[key]}>{s}@{idx}#{wid}({kind})")
            last_seq[key] = s
            got_seqs.setdefault(key, set()).add(s)
    missing = [c for c in pub if c not in ids_of_payload]
    extra = [c for c in ids_of_payload if c not in pub]
    gap_keys = [k for k, n in count_by_key.items() if got_seqs.get(k, set()) != set(range(1, n + 1))]
    publish_order = 0
    for order in publishers:
        last = {}
        for c in order:
            k = pub[c].get("key")
            if k is None or c not in seq_of_payload:
                continue
            if k in last and seq_of_payload[c] < last[k]:
                publish_order += 1
            last[k] = seq_of_payload[c]
    out = {
        "requests": len(reqs),
        "distinct": len(seen),
        "dups": len(reqs) - len(seen),
        "published": len(pub),
        "missing": len(missing),
        "missing_sample": ",".join(sorted(missing)[:5]),
        "extra": len(extra),
        "reissued": sum(1 for s in ids_of_payload.values() if len(s) > 1),
        "id_reuse": sum(1 for s in payloads_of_id.values() if len(s) > 1),
        "seq_reuse": sum(1 for s in payloads_of_seq.values() if len(s) > 1),
        "order_violations": order_violations,
        "first_order_violations": first_order_violations,
        "order_sample": " ".join(order_sample),
        "seq_mismatch": seq_mismatch,
        "seq_gap_keys": len(gap_keys),
        "publish_order": publish_order,
        "bad_signature": bad_sig,
        "envelope_errors": env_err,
    }
    for k, v in out.items():
        print(f"{k}={v}")


if __name__ == "__main__":
    main()
