#!/usr/bin/env python3
"""A counting TCP proxy for measuring what an agent costs on the wire.

    benches/wire_proxy.py LISTEN_PORT TARGET_PORT SECONDS REPORT.json [IDLE_TIMEOUT]

Listens on 127.0.0.1:LISTEN_PORT (loopback only), forwards every connection to
127.0.0.1:TARGET_PORT, and counts the bytes each way. It stops after SECONDS (a
bound, so a forgotten run ends) or on SIGTERM, and writes the totals to
REPORT.json: bytes up (agent to hub) and down, connections opened, and a log of
every chunk (time since start, direction, size, its first 24 bytes) and the first 400 bytes of one
chunk of each direction and size (to read the headers), so a script can pick out the
steady state. Application bytes only: TCP/IP and TLS framing below the proxy are
not counted (the agent speaks plain HTTP to it here).

With IDLE_TIMEOUT (seconds), a connection on which nothing has passed either way
for that long is closed, as a load balancer with an idle timeout does (an AWS load
balancer closes it; nginx answers 504): what an agent does behind one.
"""

import json
import selectors
import signal
import socket
import sys
import time

MAX_CONNECTIONS = 64


def main():
    listen_port, target_port, seconds, report = (
        int(sys.argv[1]),
        int(sys.argv[2]),
        float(sys.argv[3]),
        sys.argv[4],
    )
    idle_timeout = float(sys.argv[5]) if len(sys.argv) > 5 else None
    start = time.monotonic()
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", listen_port))
    server.listen(16)
    server.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(server, selectors.EVENT_READ, None)
    totals = {"up": 0, "down": 0, "connections": 0, "chunks": [], "samples": {}, "cut": []}
    peers = {}
    last = {}  # client socket -> when anything last passed on its connection

    def close(sock):
        other = peers.pop(sock, None)
        for s in (sock, other):
            if s is None:
                continue
            peers.pop(s, None)
            last.pop(s, None)
            try:
                sel.unregister(s)
            except (KeyError, ValueError):
                pass
            s.close()

    while not stop[0] and time.monotonic() - start < seconds:
        if idle_timeout is not None:
            now = time.monotonic()
            for client in [c for c, t in last.items() if now - t >= idle_timeout]:
                totals["cut"].append(round(now - start, 3))
                close(client)
        for key, _ in sel.select(timeout=0.2):
            sock = key.fileobj
            if key.data is None:
                client, _ = server.accept()
                if totals["connections"] >= MAX_CONNECTIONS:
                    client.close()
                    continue
                upstream = socket.create_connection(("127.0.0.1", target_port))
                totals["connections"] += 1
                peers[client] = upstream
                peers[upstream] = client
                last[client] = time.monotonic()
                sel.register(client, selectors.EVENT_READ, "up")
                sel.register(upstream, selectors.EVENT_READ, "down")
                continue
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                close(sock)
                continue
            direction = key.data
            totals[direction] += len(data)
            totals["chunks"].append(
                [round(time.monotonic() - start, 3), direction, len(data),
                 data[:24].decode("latin-1")]
            )
            sample = f"{direction} {len(data)}"
            if len(totals["samples"]) < 32 and sample not in totals["samples"]:
                totals["samples"][sample] = data[:400].decode("latin-1")
            peer = peers.get(sock)
            client = sock if direction == "up" else peer
            if client in last:
                last[client] = time.monotonic()
            if peer is not None:
                peer.sendall(data)
    totals["seconds"] = round(time.monotonic() - start, 3)
    with open(report, "w") as out:
        json.dump(totals, out)


if __name__ == "__main__":
    main()
