#!/usr/bin/env python3
"""A TCP forwarder on loopback that makes a server slow: every reply the
server sends reaches the client DELAY seconds later (in order; requests go
through at once). Used to give relaybus-mongo a store whose every command
takes at least DELAY, as FerretDB's finds do on a loaded machine.

    slow_link.py --target HOST:PORT --delay SECONDS --port-file F [--delay-file D]

Listens on 127.0.0.1 (a free port, written to --port-file). With --delay-file,
the number in file D (when it exists) replaces --delay while the link runs,
also for replies already waiting: a test raises it to stall the store for a
while and lowers it to let everything through at once.
"""
import argparse
import asyncio
import os


def delay_from(default, path):
    """The current delay: the number in path if there is one, else default."""
    if path:
        try:
            with open(path) as f:
                return float(f.read().strip())
        except (OSError, ValueError):
            pass
    return default


async def pipe(reader, writer, delay, delay_file=None):
    loop = asyncio.get_running_loop()
    queue = asyncio.Queue()

    async def read():
        while True:
            data = await reader.read(65536)
            await queue.put((loop.time(), data))
            if not data:
                return

    async def write():
        while True:
            arrived, data = await queue.get()
            while True:
                wait = arrived + delay_from(delay, delay_file) - loop.time()
                if wait <= 0:
                    break
                # With a delay file, look at it again every 50 ms.
                await asyncio.sleep(min(wait, 0.05) if delay_file else wait)
            if not data:
                writer.close()
                return
            writer.write(data)
            await writer.drain()

    try:
        await asyncio.gather(read(), write())
    except (ConnectionError, asyncio.CancelledError):
        writer.close()


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--delay", type=float, required=True)
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--delay-file")
    a = ap.parse_args()
    host, port = a.target.rsplit(":", 1)

    async def serve(creader, cwriter):
        try:
            sreader, swriter = await asyncio.open_connection(host, int(port))
        except OSError:
            cwriter.close()
            return
        await asyncio.gather(pipe(creader, swriter, 0), pipe(sreader, cwriter, a.delay, a.delay_file),
                             return_exceptions=True)

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    tmp = a.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(server.sockets[0].getsockname()[1]))
    os.rename(tmp, a.port_file)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
