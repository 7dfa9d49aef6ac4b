"""The store's circuit breaker, one per process: once the store is found down, a request is
answered at once (``StoreDownError``) instead of waiting ``IDEM_POOL_TIMEOUT`` for a pool that
cannot connect, until a probe finds the store back.

- Found down: a pooled connection that broke (in a request, or given back broken), or a pool
  that timed out, makes the pool ``suspect()`` the store, and one probe decides. It connects, or
  the server refuses it with an error of its own (53300 too many connections, 57P03 starting up,
  28P01, 3D000, PgBouncer's ``max_client_conn``: any error the server sent,
  ``sqlstates.server_answered``): the store answered, it is up (one connection had died, or the
  pool or the server was only busy), and nothing changes, so the breaker never answers for a
  store that is up, and no client can open it for the others by filling the connections. Only a
  store that did not answer (connection refused, timeout, reset, a name that does not resolve)
  opens the breaker. A pool timeout the probe finds answered is that request's ``StoreBusyError``
  alone (pool.py): 503 with ``Retry-After`` on either tier, never a run without dedup. A probe
  the server refused is followed by another one interval later (at most ``FOLLOW_UPS`` in a
  row, until one connects): a server that was refusing because it was shutting down (57P03)
  and is gone now opens the breaker then, releasing the requests that wait on the pool, instead
  of each waiting its pool timeout first.
- While open, ``admit()`` raises at once. One probe runs at a time, at most one every
  ``IDEM_STORE_PROBE_INTERVAL`` seconds, started by the first request after the interval, which
  waits for it up to that long: the first request after the store returns is served. The others
  never wait; a probe that hangs (a host that does not answer) holds no request beyond that.
- One log line per change of state: ``store_down`` (with what the probe met) and ``store_back``
  (with how long it lasted), never one per request.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from time import monotonic

from .errors import StoreDownError
from .logs import error_text, log_event
from .sqlstates import server_answered

#: Probes in a row after one the server refused, an interval apart (see the module's text).
FOLLOW_UPS = 10


class Breaker:
    """Whether this process found its store down, and the one probe that looks for it."""

    def __init__(
        self,
        probe: Callable[[], None],
        *,
        interval: float,
        probe_wait: float,
        on_change: Callable[[bool], None],
    ) -> None:
        self._probe = probe  # raises when the store cannot be reached
        self._interval = interval
        self._probe_wait = probe_wait  # how long a request that found a dead connection waits for the verdict
        self._on_change = on_change  # called with True when the breaker opens, False when it closes
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._reason = ""
        self.answer = ""  # what the last probe the server answered met ("" when it connected)
        self._running: threading.Event | None = None  # set when the running probe has decided
        self._last_probe = -math.inf
        self._follow_ups = 0  # probes in a row the server refused, each followed by another

    @property
    def is_open(self) -> bool:
        return self._down_since is not None

    def admit(self) -> None:
        """Return while the store is up; raise ``StoreDownError`` while it is known down (after
        the probe this request started, if one was due, failed)."""
        if self._down_since is None:
            return
        done = self._start(due_only=True)
        if done is not None:
            done.wait(self._interval)
        self.refuse_if_open()

    def refuse_if_open(self) -> None:
        """Raise ``StoreDownError`` if the store is known down, without probing."""
        down_since = self._down_since
        if down_since is not None:
            raise StoreDownError(
                f"the idempotency store was found down {monotonic() - down_since:.1f} s ago "
                f"({self._reason}); a probe looks for it every {self._interval:g} s"
            )

    def suspect(self, *, wait: bool = True) -> bool | None:
        """A connection died or the pool timed out: probe now (or join the running probe) and,
        with ``wait``, wait for the verdict; the breaker is open afterwards if the store did not
        answer. Without ``wait`` (a request that is done) the probe decides in the background.

        Returns True when the store answered (the probe connected, or the server refused it:
        busy, not down), False when it did not (the breaker is open), None without a verdict
        (without ``wait``, or a probe still running after ``probe_wait``)."""
        if self._down_since is not None:
            return False
        self._follow_ups = 0  # a request found it again: the refused probes may follow up again
        done = self._start(due_only=False)
        if done is None or not wait or not done.wait(self._probe_wait):
            return None
        return self._down_since is None

    def _start(self, *, due_only: bool) -> threading.Event | None:
        """Start a probe, unless one runs (then: that one's event, or None with ``due_only``) or,
        with ``due_only``, the last one began less than the interval ago (None)."""
        with self._lock:
            if self._running is not None:
                return None if due_only else self._running
            now = monotonic()
            if due_only and now - self._last_probe < self._interval:
                return None
            done = self._running = threading.Event()
            self._last_probe = now
        threading.Thread(target=self._run, args=(done,), name="idem-store-probe", daemon=True).start()
        return done

    def _run(self, done: threading.Event) -> None:
        reason: str | None = None  # why the store did not answer; None: it answered
        answer = ""
        try:
            self._probe()
        except Exception as exc:
            if server_answered(exc):  # the server refused one more connection: up, and busy
                answer = error_text(exc)
            else:  # no server spoke: the store is down
                reason = error_text(exc)
        opened: bool | None = None
        down_for = 0.0
        follow_up = False
        with self._lock:
            if answer and reason is None and self._follow_ups < FOLLOW_UPS:
                self._follow_ups += 1
                follow_up = True
            elif not answer:
                self._follow_ups = 0
            if reason is None and self._down_since is not None:
                down_for, self._down_since, opened = monotonic() - self._down_since, None, False
            elif reason is not None and self._down_since is None:
                self._down_since, self._reason, opened = monotonic(), reason, True
            self.answer = answer
            self._running = None
        try:
            if opened is True:
                log_event(logging.ERROR, "store_down", error=reason, probe_every_s=f"{self._interval:g}")
                self._on_change(True)
            elif opened is False:
                log_event(logging.WARNING, "store_back", down_s=f"{down_for:.1f}")
                self._on_change(False)
        finally:
            done.set()
            if follow_up:
                timer = threading.Timer(self._interval, self._start, kwargs={"due_only": False})
                timer.daemon = True
                timer.start()
