"""A latency-injecting TCP proxy for PostgreSQL that also counts round trips.

    python bench/proxy.py --listen 127.0.0.1:6543 --target 127.0.0.1:54435 --delay-ms 0.5

Loopback hides round trips; production does not (and netem needs root and a kernel module).
Every chunk read from either side is forwarded `--delay-ms` later (a one-way delay: 0.5 ms each
way is a 1 ms round-trip time), in order. The event loop waits in select(), whose timeout has
microsecond resolution (epoll's is a millisecond, which would round a 0.5 ms delay up to 1 ms).

Counted, client -> server, over every connection:
- round trips: a client write that follows a server answer (or opens the connection) starts one;
  the messages a client pipelines before reading anything are one round trip, as on a network;
- frontend messages by type (PostgreSQL protocol v3: Q simple query, P/B/E/D extended query,
  S Sync, X Terminate, ...), parsed from the stream after the untyped startup packet.
Use `sslmode=disable` through the proxy (TLS hides the message types, not the round trips).
The benchmark runs it in a thread (Proxy.start) and reads `counts()` before and after N
requests; stand-alone it prints the counts every `--report` seconds.

`cut()` is a network cut between the two sides (the Citus chaos soak puts the proxy between the
coordinator and a worker): every connection through it is reset at once and new ones are refused
until `heal()`, the way a link whose router answers with resets fails.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import selectors
import struct
import threading
import time


class Counts:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.round_trips = 0
        self.messages: collections.Counter[str] = collections.Counter()
        self.connections = 0

    def snapshot(self) -> tuple[int, dict[str, int], int]:
        with self.lock:
            return self.round_trips, dict(self.messages), self.connections


class _Frontend:
    """Splits the client -> server byte stream into protocol messages (types only)."""

    def __init__(self) -> None:
        self.buf = b""
        self.started = False  # the startup packet (and an SSLRequest/GSS request) has no type byte

    def feed(self, data: bytes) -> list[str]:
        self.buf += data
        types: list[str] = []
        while True:
            if not self.started:
                if len(self.buf) < 8:
                    return types
                (length,) = struct.unpack("!i", self.buf[:4])
                (code,) = struct.unpack("!i", self.buf[4:8])
                if len(self.buf) < length:
                    return types
                self.buf = self.buf[length:]
                if code in (80877103, 80877104):  # SSLRequest / GSSENCRequest: startup follows
                    types.append("ssl-request")
                    continue
                types.append("startup")
                self.started = True
                continue
            if len(self.buf) < 5:
                return types
            (length,) = struct.unpack("!i", self.buf[1:5])
            if len(self.buf) < 1 + length:
                return types
            types.append(chr(self.buf[0]))
            self.buf = self.buf[1 + length :]


class Proxy:
    def __init__(self, listen: tuple[str, int], target: tuple[str, int], delay_ms: float) -> None:
        self.listen, self.target, self.delay = listen, target, delay_ms / 1000.0
        self.counts = Counts()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.server: asyncio.base_events.Server | None = None
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._cut = False

    # -- forwarding ------------------------------------------------------------------------

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, on_data: object) -> None:
        """Read chunks, queue each with its due time, write it when due (order kept)."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def send() -> None:
            while True:
                due, chunk = await queue.get()
                if not chunk:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(chunk)
                await writer.drain()
            writer.close()

        sender = asyncio.ensure_future(send())
        try:
            while True:
                chunk = await reader.read(65536)
                if chunk:
                    on_data(chunk)  # type: ignore[operator]
                queue.put_nowait((time.monotonic() + self.delay, chunk))
                if not chunk:
                    break
        except (ConnectionError, OSError):
            queue.put_nowait((0.0, b""))
        await sender

    async def _handle(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        if self._cut:
            c_writer.transport.abort()
            return
        try:
            s_reader, s_writer = await asyncio.open_connection(*self.target)
        except OSError:
            c_writer.close()
            return
        self._open |= {c_writer, s_writer}
        frontend = _Frontend()
        state = {"answered": True}  # the first client write opens a round trip
        counts = self.counts
        with counts.lock:
            counts.connections += 1

        def from_client(chunk: bytes) -> None:
            types = frontend.feed(chunk)
            with counts.lock:
                if state["answered"]:
                    counts.round_trips += 1
                    state["answered"] = False
                counts.messages.update(types)

        def from_server(chunk: bytes) -> None:
            state["answered"] = True

        try:
            await asyncio.gather(
                self._pump(c_reader, s_writer, from_client),
                self._pump(s_reader, c_writer, from_server),
                return_exceptions=True,
            )
        finally:
            self._open -= {c_writer, s_writer}

    def _reset_all(self) -> None:
        self._cut = True
        for writer in list(self._open):
            writer.transport.abort()  # a reset, not an orderly close

    # -- running ---------------------------------------------------------------------------

    async def _serve(self) -> None:
        self.server = await asyncio.start_server(self._handle, *self.listen)
        self.listen = self.server.sockets[0].getsockname()[:2]
        self._ready.set()
        async with self.server:
            await self.server.serve_forever()

    def _run(self) -> None:
        self.loop = loop = asyncio.SelectorEventLoop(selectors.SelectSelector())
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._serve())
        except asyncio.CancelledError:
            pass
        finally:
            # The connections' tasks end with the loop, not at garbage collection ("Task was
            # destroyed but it is pending!" in the test log).
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

    def start(self) -> Proxy:
        """Serve in a daemon thread; returns once listening (port 0 picks a free one)."""
        self._thread = threading.Thread(target=self._run, name="pg-delay-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("proxy did not start")
        return self

    def stop(self) -> None:
        if self.loop is not None and self.server is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._reset_all)
            self.loop.call_soon_threadsafe(self.server.close)
            if self._thread is not None:
                self._thread.join(10)

    def cut(self) -> None:
        """Reset every connection through the proxy and refuse new ones until `heal()`."""
        assert self.loop is not None, "the proxy was not started"
        done = threading.Event()

        def reset() -> None:
            self._reset_all()
            done.set()

        self.loop.call_soon_threadsafe(reset)
        done.wait(5)

    def heal(self) -> None:
        self._cut = False


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--listen", default="127.0.0.1:6543", type=_addr)
    parser.add_argument("--target", required=True, type=_addr)
    parser.add_argument("--delay-ms", type=float, default=0.5, help="one-way delay (RTT = 2×)")
    parser.add_argument("--report", type=float, default=10.0, help="print counts every N s")
    args = parser.parse_args()
    proxy = Proxy(args.listen, args.target, args.delay_ms).start()
    print(
        f"proxy {proxy.listen[0]}:{proxy.listen[1]} -> {args.target[0]}:{args.target[1]}, {args.delay_ms} ms each way",
        flush=True,
    )
    try:
        while True:
            time.sleep(args.report)
            rt, msgs, conns = proxy.counts.snapshot()
            print(f"connections {conns}, round trips {rt}, messages {msgs}", flush=True)
    except KeyboardInterrupt:
        proxy.stop()


if __name__ == "__main__":
    main()
