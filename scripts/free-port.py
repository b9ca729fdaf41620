#!/usr/bin/env python3
"""Prints a free TCP port on 127.0.0.1, for a server the caller starts next.

The port is drawn at random from the 10,000 below the kernel's ephemeral
range (net.ipv4.ip_local_port_range) and checked free. A port that bind(0)
hands out is in that range, where any outgoing connection can take it before
the server binds it: a Kafka broker's JVM or a standby after its base backup
takes seconds to get there, and in a full test run a broker lost its
controller port that way."""
import random
import socket


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


def main():
    high = ephemeral_low()
    low = max(1024, high - 10000)
    for _ in range(500):
        port = random.randrange(low, high)
        if is_free(port):
            print(port)
            return
    with socket.socket() as s:  # all taken: the kernel's choice after all
        s.bind(("127.0.0.1", 0))
        print(s.getsockname()[1])


if __name__ == "__main__":
    main()
