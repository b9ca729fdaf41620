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
