#!/usr/bin/env python3
"""A TCP forwarder on loopback that makes a server slow: every reply the
server sends reaches the client DELAY seconds later (in order; requests go
through at once). Used to give relaybus-mongo a store whose every command
takes at least DELAY, as FerretDB's finds do on a loaded machine.

    slow_link.py --target HOST:PORT --delay SECONDS --port-file F [--delay-file D]
                 [--commands find,aggregate] [--held-file H]

Listens on 127.0.0.1 (a free port, written to --port-file). With --delay-file,
the number in file D (when it exists) replaces --delay while the link runs,
also for replies already waiting: a test raises it to stall the store for a
while and lowers it to let everything through at once. With --commands, only
the replies to those MongoDB commands (OP_MSG, by the first field of the body)
are delayed; every other reply passes at once, so a test can make one kind of
command slow and leave, e.g., the lane lease inserts fast; a command may be
narrowed to one collection (find:relay_lanes). With --held-file, file H holds
the number of replies the link is holding back past their arrival, rewritten
as it changes: a test waits on it to know the client is inside that command.
"""
import argparse
import asyncio
import os
import struct


def delay_from(default, path):
    """The current delay: the number in path if there is one, else default."""
    if path:
        try:
            with open(path) as f:
                return float(f.read().strip())
        except (OSError, ValueError):
            pass
    return default


OP_MSG = 2013


def command_names(msg):
    """The command an OP_MSG request runs (its body's first field) and that
    command's collection (the field's string value): (name, collection), or
    (None, None) for any other message."""
    _, _, _, opcode = struct.unpack_from("<iiii", msg)
    if opcode != OP_MSG or len(msg) < 26 or msg[20] != 0:  # flags, then a kind-0 body section
        return None, None
    end = msg.index(b"\0", 26)  # element: type byte at 25, then its name (a C string)
    name = msg[26:end].decode("utf-8", "replace")
    if msg[25] != 2:  # not a string: no collection
        return name, None
    (n,) = struct.unpack_from("<i", msg, end + 1)  # string: int32 length (with its NUL), then the bytes
    return name, msg[end + 5 : end + 4 + n].decode("utf-8", "replace")


def frames(buf):
    """Splits whole wire messages off the front of buf: (messages, rest)."""
    out = []
    while len(buf) >= 16:
        (n,) = struct.unpack_from("<i", buf)
        if len(buf) < n:
            break
        out.append(bytes(buf[:n]))
        buf = buf[n:]
    return out, buf


async def pipe(reader, writer, delay, delay_file=None, slow=None, holding=None):
    """Copies reader to writer, every chunk `delay` late. slow: a function of
    one whole wire message saying whether it is delayed (messages are then
    framed); None: every byte is. holding(+1 / -1): a delayed message is held
    past its arrival / let go."""
    loop = asyncio.get_running_loop()
    queue = asyncio.Queue()

    async def read():
        buf = b""
        while True:
            data = await reader.read(65536)
            if slow is None or not data:
                await queue.put((loop.time(), data, slow is None or not data))
                if not data:
                    return
                continue
            msgs, buf = frames(buf + data)
            for m in msgs:
                await queue.put((loop.time(), m, slow(m)))

    async def write():
        while True:
            arrived, data, delayed = await queue.get()
            held = False
            while delayed:
                wait = arrived + delay_from(delay, delay_file) - loop.time()
                if wait <= 0:
                    break
                if holding and not held:
                    held = True
                    holding(1)
                # With a delay file, look at it again every 50 ms.
                await asyncio.sleep(min(wait, 0.05) if delay_file else wait)
            if held:
                holding(-1)
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
    ap.add_argument(
        "--commands", help="comma-separated: delay only the replies to these commands (find, or find:COLLECTION)"
    )
    ap.add_argument("--held-file", help="the number of replies held back right now is written here")
    a = ap.parse_args()
    host, port = a.target.rsplit(":", 1)
    only = set(a.commands.split(",")) if a.commands else None
    held = [0]

    def holding(change):
        held[0] += change
        tmp = a.held_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(held[0]))
        os.rename(tmp, a.held_file)

    if a.held_file:
        holding(0)

    async def serve(creader, cwriter):
        try:
            sreader, swriter = await asyncio.open_connection(host, int(port))
        except OSError:
            cwriter.close()
            return
        if only is None:
            requests, replies = pipe(creader, swriter, 0), pipe(sreader, cwriter, a.delay, a.delay_file)
        else:  # the request ids of the slow commands; a reply names its request (responseTo)
            slow_ids = set()

            def note(msg):
                name, collection = command_names(msg)
                if name in only or "%s:%s" % (name, collection) in only:
                    slow_ids.add(struct.unpack_from("<i", msg, 4)[0])
                return False

            def late(msg):
                to = struct.unpack_from("<i", msg, 8)[0]
                if to in slow_ids:
                    slow_ids.discard(to)
                    return True
                return False

            requests = pipe(creader, swriter, 0, slow=note)
            replies = pipe(sreader, cwriter, a.delay, a.delay_file, slow=late, holding=a.held_file and holding)
        await asyncio.gather(requests, replies, return_exceptions=True)

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    tmp = a.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(server.sockets[0].getsockname()[1]))
    os.rename(tmp, a.port_file)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
