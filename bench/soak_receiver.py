#!/usr/bin/env python3
"""The webhook receiver of bench/soak.sh: answers every POST with 200 and
appends one line per request to --log:

    RECV_EPOCH <TAB> WEBHOOK_ID <TAB> EVENT_ID <TAB> PUBLISHED_EPOCH

(EVENT_ID and PUBLISHED_EPOCH from the envelope body: "event_id" and
"payload"."t"; "-" when missing). It keeps nothing in memory, so a long soak
does not grow it (test/integration/http_receiver.py keeps every request).

    soak_receiver.py --port-file F --log F
"""
import argparse
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
LOG = None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        recv = time.time()
        event_id, t_pub = "-", "-"
        try:
            env = json.loads(body)
            event_id = str(env.get("event_id", "-"))
            t_pub = str((env.get("payload") or {}).get("t", "-"))
        except (ValueError, AttributeError):
            pass
        line = f"{recv:.6f}\t{self.headers.get('webhook-id', '-')}\t{event_id}\t{t_pub}\n"
        with LOCK:
            LOG.write(line)
            LOG.flush()
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256


def main():
    global LOG
    ap = argparse.ArgumentParser()
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--log", required=True)
    args = ap.parse_args()
    LOG = open(args.log, "a", encoding="utf-8")
    srv = Server(("127.0.0.1", 0), Handler)
    with open(args.port_file + ".tmp", "w") as f:
        f.write(str(srv.server_address[1]))
    os.replace(args.port_file + ".tmp", args.port_file)
    srv.serve_forever()


if __name__ == "__main__":
    main()
