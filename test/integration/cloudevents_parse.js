// Parses relaybus's CloudEvents with the npm `cloudevents` SDK (the
// integration test puts it on NODE_PATH); the same input and output as
// cloudevents_parse.py.
//
//     node cloudevents_parse.js http|kafka MESSAGES.json
"use strict";
const fs = require("fs");
const { HTTP, Kafka } = require("cloudevents");

const ATTRS = ["specversion", "id", "source", "type", "subject", "time", "datacontenttype", "relaybusseq",
  "relaybusattempt"];

function parse(binding, m) {
  if (binding === "http") return HTTP.toEvent({ headers: m.headers, body: m.body });
  return Kafka.toEvent({ headers: m.headers, key: m.key, value: m.body, body: m.body });
}

const out = [];
for (const m of JSON.parse(fs.readFileSync(process.argv[3], "utf8"))) {
  let e;
  try {
    e = parse(process.argv[2], m);
  } catch (err) {
    out.push({ error: String(err && err.message ? err.message : err) });
    continue;
  }
  const got = {};
  for (const a of ATTRS) if (e[a] !== undefined && e[a] !== null) got[a] = String(e[a]);
  got.data = typeof e.data === "string" ? JSON.parse(e.data) : e.data;
  out.push(got);
}
console.log(JSON.stringify(out));
