"""Inserts a backlog of delivery documents for one handler in bulk (one
insert_many per 500), in the documented format (docs/mongo.md, "Data model"),
with ids counted on from the database's relay_counters (a sequencer that
starts later reads it and continues above). Bypasses the outbox: for tests
that need thousands of pending deliveries at once.

    python3 mongo_bulk_load.py URI DB HANDLER TOPIC COUNT NKEYS PRIORITY [PAYLOAD_TAG]

NKEYS 0 = unkeyed events. Prints the number of documents inserted.
"""
import datetime
import sys

import pymongo


def lane_for_key(key):
    """fnv1a64(UTF-8 bytes) mod 64: relay.lane_of() and relaybus-mongo's lane."""
    h = 0xCBF29CE484222325
    for b in key.encode("utf-8"):
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h % 64


def main():
    uri, dbname, handler, topic = sys.argv[1:5]
    count, nkeys, priority = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
    tag = sys.argv[8] if len(sys.argv) > 8 else "p%d" % priority
    db = pymongo.MongoClient(uri)[dbname]
    first = db.relay_counters.find_one_and_update(
        {"_id": "ids"}, {"$inc": {"n": count}}, upsert=True, return_document=pymongo.ReturnDocument.AFTER)["n"] - count + 1
    now = datetime.datetime.now(datetime.timezone.utc)
    seqs = {}
    docs = []
    for i in range(count):
        did = first + i
        d = {"_id": did, "event_id": did, "handler": handler, "priority": priority, "not_before": now,
             "published_at": now, "attempt": 0, "topic": topic, "payload": {"tag": tag, "n": i}}
        if nkeys:
            key = "%s-k%d" % (tag, i % nkeys)
            seqs[key] = seqs.get(key, 0) + 1
            d.update(key=key, seq=seqs[key], lane=lane_for_key(key))
        else:
            d.update(seq=did, lane=did % 64)
        docs.append(d)
    for j in range(0, len(docs), 500):
        db.relay_deliveries.insert_many(docs[j:j + 500])
    print(len(docs))


if __name__ == "__main__":
    main()
