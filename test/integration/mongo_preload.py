"""Publishes through the documented application path (docs/examples/publish_pymongo.py:
one insert into relay_outbox per event), printing one JSON line per event:
{"payload", "key"?} (what tests/mongo_check.py matches the receiver's requests against).

    python3 mongo_preload.py URI DB TOPIC COUNT NKEYS [UNKEYED_EVERY] [--tag T] [--many]

--tag T: the payloads are {"t": T, "n": i} (distinct across concurrent publishers);
--many: one insert_many per 500 events instead of one insert per event (a fast preload).
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "examples"))
import pymongo  # noqa: E402
from publish_pymongo import publish  # noqa: E402


def main():
    args = sys.argv[1:]
    many = "--many" in args
    if many:
        args.remove("--many")
    tag = None
    if "--tag" in args:
        i = args.index("--tag")
        tag = args[i + 1]
        del args[i:i + 2]
    uri, dbname, topic, count, nkeys = args[0], args[1], args[2], int(args[3]), int(args[4])
    unkeyed_every = int(args[5]) if len(args) > 5 else 0
    db = pymongo.MongoClient(uri)[dbname]
    batch = []
    for i in range(count):
        key = None if unkeyed_every and i % unkeyed_every == 0 else f"k{i % nkeys}"
        payload = {"n": i} if tag is None else {"t": tag, "n": i}
        line = {"payload": payload}
        if key is not None:
            line["key"] = key
        if many:
            doc = {"topic": topic, "payload": payload}
            if key is not None:
                doc["key"] = key
            batch.append(doc)
            if len(batch) == 500:
                db.relay_outbox.insert_many(batch, ordered=True)
                batch = []
        else:
            publish(db, topic, payload, key=key)
        print(json.dumps(line), flush=True)
    if batch:
        db.relay_outbox.insert_many(batch, ordered=True)


if __name__ == "__main__":
    main()
