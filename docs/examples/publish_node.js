// Publishing to relaybus from a Node.js application (the official `mongodb`
// driver): one insert into relay_outbox (docs/mongo.md, "The outbox"). The
// application needs the insert right on relay_outbox and nothing else.
//
//   const { publish } = require("./publish_node");
//   await session.withTransaction(async () => {            // replica set: atomic with the order
//     await db.collection("orders").insertOne(order, { session });
//     await publish(client.db("relaybus"), "order.created", { id: 42 }, { key: "order-42", session });
//   });
async function publish(db, topic, payload, { key, headers, priority, notBefore, dedupeKey, session } = {}) {
  const doc = { topic, payload };
  if (key !== undefined) doc.key = key;
  if (headers !== undefined) doc.headers = headers;
  if (priority !== undefined) doc.priority = priority;
  if (notBefore !== undefined) doc.not_before = notBefore; // a Date
  if (dedupeKey !== undefined) doc.dedupe_key = dedupeKey;
  const r = await db.collection("relay_outbox").insertOne(doc, session ? { session } : {});
  return r.insertedId; // an ObjectId: its order is the sequencer's order
}

module.exports = { publish };
