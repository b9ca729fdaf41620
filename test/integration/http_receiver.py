#!/usr/bin/env python3
"""A real HTTP receiver on loopback for the webhook tests.

    http_receiver.py --port-file F [--log F]

Serves HTTP/1.1 with keep-alive on 127.0.0.1 (a free port, written to
--port-file). Every request to any path except /_control/... is recorded as
one JSON line in --log: {"t", "path", "headers" (lower-case names), "body",
"answered", "active" (requests of the path being served at its arrival, itself
included: the concurrency the sender reached)} and answered by the path's
behaviour:

    POST /_control/<path>   body: a JSON list of behaviours applied to the next
                            requests of /<path>, in order; when the list is empty
                            the answer is 200. A behaviour:
                            {"status": 500}, {"status": 429, "retry_after": "2"},
                            {"delay": 3.0} (then 200), {"hold": "FILE"}
                            (200 once FILE exists, at most 120 s later: the
                            test answers when it has looked), {"drop": true}
                            (close the connection without answering),
                            {"status": 200, "repeat": true} (sticky).
                            With "match": "text", a behaviour applies only to
                            requests whose body contains the text; the first
                            behaviour of the list that applies is used.
    GET  /_requests         every recorded request as a JSON list
    GET  /_count?path=P[&min=N&timeout=S]
                            the number of requests of P recorded; with min and
                            timeout, answers once there are N (or S seconds
                            have passed), so that a wait ends on the request
                            it waits for and polls nothing meanwhile
    GET  /_health           200
"""
import argparse
import json
import os
import socketserver
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
RECORDED = threading.Condition(LOCK)  # notified at each recorded request
PLANS = {}      # path -> list of behaviours
ACTIVE = {}     # path -> requests being served
COUNTS = {}     # path -> requests recorded
RECORDS = []
LOG = None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _reply(self, status, body=b"", headers=None):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/_requests":
            with LOCK:
                body = json.dumps(RECORDS).encode()
            self._reply(200, body, {"Content-Type": "application/json"})
        elif self.path.startswith("/_count?"):
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
            path = query.get("path", [""])[0]
            least = int(query.get("min", ["0"])[0])
            deadline = time.monotonic() + float(query.get("timeout", ["0"])[0])
            with RECORDED:
                while COUNTS.get(path, 0) < least and time.monotonic() < deadline:
                    RECORDED.wait(deadline - time.monotonic())
                count = COUNTS.get(path, 0)
            self._reply(200, str(count).encode())
        elif self.path == "/_health":
            self._reply(200, b"ok")
        else:
            self._reply(404)

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.path.startswith("/_control/"):
            path = "/" + self.path[len("/_control/"):]
            with LOCK:
                PLANS[path] = list(json.loads(body or b"[]"))
            self._reply(204)
            return
        with LOCK:
            plan = PLANS.get(self.path, [])
            text = body.decode("utf-8", "replace")
            pick = next((i for i, b in enumerate(plan) if "match" not in b or b["match"] in text), None)
            behaviour = plan[pick] if pick is not None else {"status": 200}
            if pick is not None and not behaviour.get("repeat"):
                plan.pop(pick)
            ACTIVE[self.path] = ACTIVE.get(self.path, 0) + 1
            record = {
                "active": ACTIVE[self.path],
                "t": time.time(),
                "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "body": text,
                "answered": behaviour,
            }
            RECORDS.append(record)
            COUNTS[self.path] = COUNTS.get(self.path, 0) + 1
            RECORDED.notify_all()
            if LOG:
                LOG.write(json.dumps(record) + "\n")
                LOG.flush()
        if behaviour.get("delay"):
            time.sleep(float(behaviour["delay"]))
        if behaviour.get("hold"):
            deadline = time.monotonic() + 120
            while not os.path.exists(behaviour["hold"]) and time.monotonic() < deadline:
                time.sleep(0.05)
        # Before the answer: once the sender has it, it may send the next
        # request, which must not count this one.
        with LOCK:
            ACTIVE[self.path] -= 1
        if behaviour.get("drop"):
            self.close_connection = True
            self.connection.shutdown(2)
            return
        headers = {}
        if "retry_after" in behaviour:
            headers["Retry-After"] = str(behaviour["retry_after"])
        self._reply(int(behaviour.get("status", 200)), b"", headers)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256


def main():
    global LOG
    ap = argparse.ArgumentParser()
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--log")
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    if args.log:
        LOG = open(args.log, "a", encoding="utf-8")
    srv = Server(("127.0.0.1", args.port), Handler)
    with open(args.port_file + ".tmp", "w") as f:
        f.write(str(srv.server_address[1]))
    import os
    os.replace(args.port_file + ".tmp", args.port_file)
    srv.serve_forever()


if __name__ == "__main__":
    main()
