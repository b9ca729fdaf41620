#!/usr/bin/env python3
"""Parses relaybus's CloudEvents with the PyPI `cloudevents` SDK (the
integration test puts it on PYTHONPATH).

    cloudevents_parse.py http|kafka MESSAGES.json

MESSAGES.json: a list of {"headers": {name: value}, "body": text, "key": text
or null}, as a receiver or a Kafka consumer saw them. Prints one JSON list:
for each message its attributes as the SDK read them (values as strings,
data as parsed JSON), or {"error": ...} when the SDK refused it.
"""
import json
import sys

from cloudevents.http import from_http
from cloudevents.kafka import KafkaMessage, from_binary, from_structured

ATTRS = ("specversion", "id", "source", "type", "subject", "time", "datacontenttype", "relaybusseq",
         "relaybusattempt")


def parse(binding, m):
    if binding == "http":
        return from_http(m["headers"], m["body"].encode())
    km = KafkaMessage(headers={k: v.encode() for k, v in m["headers"].items()},
                      key=None if m["key"] is None else m["key"].encode(), value=m["body"].encode())
    if m["headers"].get("content-type", "").startswith("application/cloudevents"):
        return from_structured(km)
    return from_binary(km)


out = []
for m in json.load(open(sys.argv[2], encoding="utf-8")):
    try:
        e = parse(sys.argv[1], m)
    except Exception as exc:  # the SDK's refusal is the test's finding
        out.append({"error": f"{type(exc).__name__}: {exc}"})
        continue
    got = {a: str(e.get(a)) for a in ATTRS if e.get(a) is not None}
    got["data"] = e.get_data()
    out.append(got)
print(json.dumps(out))
