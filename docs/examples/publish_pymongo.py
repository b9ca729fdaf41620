"""Publishing to relaybus from a Python (pymongo) application: one insert into
relay_outbox (docs/mongo.md, "The outbox"). The application needs the insert
right on relay_outbox and nothing else; the relaybus-mongo sequencer assigns
the event id, the key's seq, the lane and the deliveries.

    from publish_pymongo import publish
    with client.start_session() as s:
        with s.start_transaction():                      # replica set: atomic with the order
            db.orders.insert_one(order, session=s)
            publish(client.relaybus, "order.created", {"id": 42}, key="order-42", session=s)

Without a session (FerretDB v1, a standalone server) the insert is on its own.
"""


def publish(db, topic, payload, key=None, headers=None, priority=None, not_before=None, dedupe_key=None,
            session=None):
    """Returns the outbox document's _id (an ObjectId: its order is the sequencer's order)."""
    doc = {"topic": topic, "payload": payload}
    for name, value in (("key", key), ("headers", headers), ("priority", priority),
                        ("not_before", not_before), ("dedupe_key", dedupe_key)):
        if value is not None:
            doc[name] = value
    return db.relay_outbox.insert_one(doc, session=session).inserted_id
