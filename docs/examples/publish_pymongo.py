"""Publishing to relaybus from a Python (pymongo) application, in the
application's own MongoDB transaction. See docs/mongo.md, "Publishing".

    from publish_pymongo import publish
    with client.start_session() as s:
        with s.start_transaction():
            db.orders.insert_one(order, session=s)
            publish(db, "order.created", {"id": 42}, key="order-42", session=s)
            # -> {"event_id": 7, "deliveries": [7], "lane": 20, "key": "order-42", "seq": 1}

The event and its deliveries commit or roll back with the transaction. The
ids are drawn outside the transaction (like a PostgreSQL sequence: a rolled
back publish leaves a gap), so concurrent publishers never conflict on the
counter; the key's seq is drawn inside it, so publishers of one key are
serialized by the key's document until commit (seq order = commit order).

Without a session (FerretDB v1, a standalone server) the same code publishes
without atomicity; docs/mongo.md says which guarantees remain.
"""
import datetime

LANES = 64
FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3


def lane_for_key(key: str) -> int:
    """fnv1a64(UTF-8 bytes) mod 64: the same lane as relay.lane_of() and relaybus-mongo."""
    h = FNV_OFFSET
    for b in key.encode("utf-8"):
        h ^= b
        h = (h * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h % LANES


def _matches(pattern: str, topic: str) -> bool:
    p, t = pattern.split("."), topic.split(".")

    def go(i, j):
        if i == len(p):
            return j == len(t)
        if p[i] == "#":
            return any(go(i + 1, k) for k in range(j, len(t) + 1))
        return j < len(t) and (p[i] == "*" or p[i] == t[j]) and go(i + 1, j + 1)

    return go(0, 0)


def _specificity(pattern: str) -> int:
    segs = pattern.split(".")
    if "*" not in segs and "#" not in segs:
        return 0
    return 1 + segs.count("*") + 100 * segs.count("#")


def publish(db, topic, payload, key=None, headers=None, priority=1, not_before=None, session=None):
    """Returns {"event_id", "deliveries", "seq" (keyed), "lane"}. Raises on a
    duplicate key (retry the transaction)."""
    handlers = {h["_id"] for h in db.relay_handlers.find({}, session=session)}
    chosen = {}  # handler -> (specificity, wire name)
    for r in db.relay_routes.find({}, session=session):
        if r["handler"] in handlers and _matches(r["pattern"], topic):
            s = _specificity(r["pattern"])
            if r["handler"] not in chosen or s < chosen[r["handler"]][0]:
                chosen[r["handler"]] = (s, r.get("wire_name"))
    n = max(1, len(chosen))
    # Outside the transaction: no session.
    first = db.relay_counters.find_one_and_update(
        {"_id": "ids"}, {"$inc": {"n": n}}, upsert=True, return_document=True)["n"] - n + 1
    if not chosen:
        return {"event_id": first, "deliveries": []}
    seq = None
    if key is not None:
        seq = db.relay_key_seqs.find_one_and_update(
            {"_id": key}, {"$inc": {"seq": 1}}, upsert=True, return_document=True, session=session)["seq"]
    lane = lane_for_key(key) if key is not None else first % LANES
    now = datetime.datetime.now(datetime.timezone.utc)
    docs = []
    for i, (handler, (_, wire)) in enumerate(sorted(chosen.items())):
        d = {"_id": first + i, "event_id": first, "handler": handler, "lane": lane,
             "seq": seq if key is not None else first + i, "priority": priority,
             "not_before": not_before or now, "published_at": now, "attempt": 0,
             "topic": topic, "payload": payload}
        if key is not None:
            d["key"] = key
        if wire:
            d["wire_topic"] = wire
        if headers is not None:
            d["headers"] = headers
        docs.append(d)
    db.relay_deliveries.insert_many(docs, session=session)
    out = {"event_id": first, "deliveries": [d["_id"] for d in docs], "lane": lane}
    if key is not None:
        out["key"], out["seq"] = key, seq
    return out
