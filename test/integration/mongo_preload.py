"""Preloads a backlog through the documented application path
(docs/examples/publish_pymongo.py), printing one JSON line per event in the
format of `relaybus-mongo publish`.

    python3 mongo_preload.py URI DB TOPIC COUNT NKEYS [UNKEYED_EVERY]
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "examples"))
import pymongo  # noqa: E402
from publish_pymongo import publish  # noqa: E402


def main():
    uri, dbname, topic, count, nkeys = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    unkeyed_every = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    db = pymongo.MongoClient(uri)[dbname]
    for i in range(count):
        key = None if unkeyed_every and i % unkeyed_every == 0 else f"k{i % nkeys}"
        r = publish(db, topic, {"n": i}, key=key)
        print(json.dumps(r))


if __name__ == "__main__":
    main()
