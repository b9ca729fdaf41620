"""Reading the JSON-lines log of http_receiver.py (imported by the webhook tests).

    records(log, path=None) -> list of dicts, in arrival order, each with the
        receiver's fields ("t", "path", "headers", "body", "answered") plus
        "env": the body parsed as JSON (None if it is not JSON).
    facts(d): prints "name=value" lines for http_lib.sh's py_facts.
    disorder(recs): events that arrived after a later one of their key
        (keys in env "key", order in env["payload"]["i"]).
    rates_around(t, at, skip=1): arrivals per second of the times t before
        `at` (the first `skip` of them left out: a burst) and from a second
        after it ("0" with 20 or fewer after), as text with one decimal.
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


def disorder(recs):
    last, n = {}, 0
    for r in recs:
        k, i = r["env"]["key"], r["env"]["payload"]["i"]
        n += last.get(k, 0) > i
        last[k] = i
    return n


def rates_around(t, at, skip=1):
    before = [x for x in t if x < at]
    after = [x for x in t if x >= at + 1.0]
    b = f"{(len(before) - skip) / max(before[-1] - before[0], 1e-3):.1f}"
    a = f"{(len(after) - 1) / (after[-1] - after[0]):.1f}" if len(after) > 20 else "0"
    return b, a
