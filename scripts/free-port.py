#!/usr/bin/env python3
"""Prints a free TCP port on 127.0.0.1, for a server the caller starts next.

The port is drawn at random from the 10,000 below the kernel's ephemeral
range (net.ipv4.ip_local_port_range) and checked free. A port that bind(0)
hands out is in that range, where any outgoing connection can take it before
the server binds it: a Kafka broker's JVM or a standby after its base backup
takes seconds to get there, and in a full test run a broker lost its
controller port that way.

A port handed out is not handed out again for ten minutes (a record in the
temporary directory, under a lock): a caller that starts its server later
(a second FerretDB, a standby) keeps the port free only by that, and in a
full run another suite's cluster drew such a port in between."""
import fcntl
import os
import random
import socket
import tempfile
import time

RECENT_SECONDS = 600


def ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def is_free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick(recent):
    high = ephemeral_low()
    low = max(1024, high - 10000)
    for _ in range(500):
        port = random.randrange(low, high)
        if port not in recent and is_free(port):
            return port
    return None


def main():
    path = os.path.join(tempfile.gettempdir(), "relaybus-free-ports.%d" % os.getuid())
    try:
        with open(path, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            now = time.time()
            recent = {}
            for line in f:
                fields = line.split()
                if len(fields) == 2 and now - float(fields[1]) < RECENT_SECONDS:
                    recent[int(fields[0])] = fields[1]
            port = pick(recent)
            if port is not None:
                recent[port] = "%.0f" % now
                f.seek(0)
                f.truncate()
                f.write("".join("%d %s\n" % item for item in recent.items()))
                f.flush()
                print(port)
                return
    except (OSError, ValueError):
        port = pick({})
        if port is not None:
            print(port)
            return
    with socket.socket() as s:  # all taken: the kernel's choice after all
        s.bind(("127.0.0.1", 0))
        print(s.getsockname()[1])


if __name__ == "__main__":
    main()
