"""The sidecar's delivery documents, wherever they are: relay_deliveries
(replays, 0.1.0's documents) and the segments relay_deliveries_<first id>
(docs/mongo.md, "Delivery segments"). For the tests' own checks."""


def collections(db):
    names = db.list_collection_names()
    return [db[n] for n in sorted(names) if n == 'relay_deliveries' or n.startswith('relay_deliveries_')]


def find(db, flt=None):
    return [d for c in collections(db) for d in c.find(flt or {})]


def find_one(db, flt):
    for c in collections(db):
        d = c.find_one(flt)
        if d is not None:
            return d
    return None


def count(db, flt=None):
    return sum(c.count_documents(flt or {}) for c in collections(db))


def update_many(db, flt, update):
    return sum(c.update_many(flt, update).modified_count for c in collections(db))


def describe_left(db, limit=8):
    """One line per kind of what is left, for a test's failure message: the
    outbox, the deliveries by collection (id, key, seq, attempt, not_before),
    the counters (next_id, inserted_below) and the segment list."""
    out = [f"outbox: {db.relay_outbox.count_documents({})} documents, first ids "
           f"{[d['_id'] for d in db.relay_outbox.find({}, {'_id': 1}).sort('_id', 1).limit(3)]}"]
    for c in collections(db):
        docs = list(c.find({}).sort('_id', 1))
        if docs:
            out.append(f"{c.name}: {len(docs)}: " + ", ".join(
                f"{d['_id']}:{d.get('key')}#{d.get('seq')} a{d.get('attempt')} nb{d.get('not_before')}" for d in docs[:limit]))
    out.append("counters: " + ", ".join(f"{d['_id']}={ {k: v for k, v in d.items() if k != '_id'} }"
                                        for d in db.relay_counters.find({})))
    out.append("segments: " + ", ".join(str(d['_id']) for d in db.relay_segments.find({}).sort('_id', 1)))
    return "\n".join(out)
