"""Checks what the HTTP receiver got against what relaybus-mongo published.

    python3 mongo_check.py --receiver PORT --path /a --published PUB [--secret whsec_...]

PUB: the stdout of `relaybus-mongo publish` calls, one JSON object per line
({"event_id", "deliveries", "key"?, "seq"?, "lane"}). Prints name=value lines:

  requests         requests received on the path
  distinct         distinct webhook-ids
  dups             requests beyond the first per webhook-id
  missing          published deliveries never received (missing_ids: the first 20)
  extra            received ids never published
  order_violations per key, a seq lower than the key's previous one in receive order
  seq_mismatch     envelopes whose key/seq differ from what publish returned
  seq_gap_keys     keys whose received seqs are not exactly the published ones
  bad_signature    requests whose webhook-signature does not verify (with --secret)
  envelope_errors  bodies that are not the envelope with the right id, webhook-id
                   without the "msg_mongo_" prefix, or no published_at
"""
import argparse
import json
import urllib.request


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--receiver", required=True)
    ap.add_argument("--path", required=True)
    ap.add_argument("--published", required=True)
    ap.add_argument("--secret")
    a = ap.parse_args()
    reqs = json.load(urllib.request.urlopen(f"http://127.0.0.1:{a.receiver}/_requests"))
    reqs = [r for r in reqs if r["path"] == a.path]
    pub = {}
    seqs_by_key = {}
    with open(a.published) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            p = json.loads(line)
            for d in p["deliveries"]:
                pub[d] = p
            if "key" in p:
                seqs_by_key.setdefault(p["key"], set()).add(p["seq"])
    wh = None
    if a.secret:
        from standardwebhooks import Webhook
        wh = Webhook(a.secret)
    seen = {}
    last_seq = {}
    got_seqs = {}
    order_violations = seq_mismatch = bad_sig = env_err = 0
    for r in reqs:
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
        p = pub.get(wid)
        key = body.get("key")
        if p is not None and (p.get("key") != key or p.get("seq") != (body.get("seq") if key is not None else None)):
            seq_mismatch += 1
        if key is not None:
            s = body.get("seq")
            if key in last_seq and s < last_seq[key]:
                order_violations += 1
            last_seq[key] = s
            got_seqs.setdefault(key, set()).add(s)
    missing = [d for d in pub if d not in seen]
    extra = [d for d in seen if d not in pub]
    gap_keys = [k for k, s in seqs_by_key.items() if got_seqs.get(k, set()) != s]
    out = {
        "requests": len(reqs),
        "distinct": len(seen),
        "dups": len(reqs) - len(seen),
        "published": len(pub),
        "missing": len(missing),
        "missing_ids": ",".join(map(str, sorted(missing)[:20])),
        "extra": len(extra),
        "order_violations": order_violations,
        "seq_mismatch": seq_mismatch,
        "seq_gap_keys": len(gap_keys),
        "bad_signature": bad_sig,
        "envelope_errors": env_err,
    }
    for k, v in out.items():
        print(f"{k}={v}")


if __name__ == "__main__":
    main()
