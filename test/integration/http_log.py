"""Reading the JSON-lines log of http_receiver.py (imported by the webhook tests).

    records(log, path=None) -> list of dicts, in arrival order, each with the
        receiver's fields ("t", "path", "headers", "body", "answered") plus
        "env": the body parsed as JSON (None if it is not JSON).
    facts(d): prints "name=value" lines for http_lib.sh's py_facts.
"""
import json


def records(log, path=None):
    out = []
    with open(log, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except ValueError:
                continue  # a line being written
            if path is not None and r["path"] != path:
                continue
            try:
                r["env"] = json.loads(r["body"])
            except ValueError:
                r["env"] = None
            out.append(r)
    return out


def facts(d):
    for k, v in d.items():
        if isinstance(v, bool):
            v = int(v)
        print(f"{k}={v}")
