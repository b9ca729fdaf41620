"""What http_receiver.py got from relaybus-agent, against what was published
(test/integration/agent_delivery.sh).

    python3 agent_http.py LOG PATH PUBLISHED [--rolled-back F] [--secret S] [--leased F]

PUBLISHED: "event_id|key" lines of the committed events; --rolled-back: event
ids of rolled-back publishes; --leased: delivery ids that were leased when an
agent was killed. Prints name=value lines (http_lib.sh's py_facts):

  requests      requests of PATH
  distinct      distinct event ids among them
  dups          requests - distinct
  missing       committed events never received
  extra         received events never committed
  rolled_back   rolled-back events received
  order         per key, first arrivals whose seq is not the key's previous
                first arrival + 1 (gapless, in order)
  signed_ok     requests whose signature verifies with SECRET (standardwebhooks)
  dups_unleased duplicated deliveries that were not leased at the kill
"""
import argparse

import http_log

ap = argparse.ArgumentParser()
ap.add_argument("log")
ap.add_argument("path")
ap.add_argument("published")
ap.add_argument("--rolled-back")
ap.add_argument("--secret")
ap.add_argument("--leased")
args = ap.parse_args()
log, path, published, secret = args.log, args.path, args.published, args.secret

pub = {}
with open(published, encoding="utf-8") as f:
    for line in f:
        line = line.strip()
        if line:
            eid, key = line.split("|", 1)
            pub[int(eid)] = key
rb = set()
if args.rolled_back:
    with open(args.rolled_back, encoding="utf-8") as f:
        rb = {int(x) for x in f.read().split()}
leased = None
if args.leased:
    with open(args.leased, encoding="utf-8") as f:
        leased = {int(x) for x in f.read().split()}

verifier = None
if secret:
    from standardwebhooks.webhooks import Webhook, WebhookVerificationError
    verifier = Webhook(secret)

f = dict(requests=0, distinct=0, dups=0, missing=0, extra=0, rolled_back=0, order=0, signed_ok=0, dups_unleased=0)
seen = set()
last = {}
for r in http_log.records(log, path):
    f["requests"] += 1
    env = r["env"] or {}
    eid = env.get("event_id")
    if verifier is not None:
        try:
            verifier.verify(r["body"].encode("utf-8"), r["headers"])
            f["signed_ok"] += 1
        except WebhookVerificationError:
            pass
    if eid in rb:
        f["rolled_back"] += 1
    if eid not in pub:
        f["extra"] += 1
    if eid in seen:
        if leased is not None and env.get("id") not in leased:
            f["dups_unleased"] += 1
        continue
    seen.add(eid)
    key = env.get("key")
    if key is not None:
        if env.get("seq") != last.get(key, 0) + 1:
            f["order"] += 1
        last[key] = env.get("seq")
f["distinct"] = len(seen)
f["dups"] = f["requests"] - f["distinct"]
f["missing"] = len(set(pub) - seen)
http_log.facts(f)
