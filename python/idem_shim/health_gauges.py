"""Gauges of what only the database knows, read from the ``idem_health`` view at scrape time.

The counters say what this process saw; an alert on a cleanup that stopped, or on holders stuck
in flight, needs what is in the store, whoever wrote it. ``idem_health`` reads the whole table
(one sequential scan, no lock), so a scrape reuses the last reading for
``IDEM_HEALTH_GAUGE_INTERVAL`` seconds (a Prometheus scraping every 15 s costs one scan a
minute); ``Store.health_rows`` waits at most a second for a pooled connection and bounds the
query with a statement timeout of its own.

The gauges' ``endpoint`` label is one of the scopes the app declares (its decorated routes',
``IDEM_GAUGE_SCOPES``) or ``other``: every other endpoint text in the store (a job of another app,
a route since renamed, or rows a member of ``idem_app`` claimed under made-up names) is summed
into that one series by ``public.idem_health(p_scopes)``, so the series stay bounded whatever the
table holds (issue 39, F5).

A reading that fails (store down, the view refused to this role, a timeout) counts as a store
error of stage ``health`` and sets ``idempotency_store_health_up`` to 0; the store's figures are
then left out rather than repeated stale. It never raises: ``/metrics`` always answers.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from time import monotonic, perf_counter
from typing import Any, Final

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

logger = logging.getLogger("idem_shim.health")

#: The ``endpoint`` label of every endpoint the app does not declare (``config.validate_scope``
#: refuses it as a scope, so no route's series can be taken for it).
OTHER_SCOPE: Final = "other"
#: The store errors' ``stage`` of a failed reading (the alert rules select on it).
STAGE: Final = "health"
_PREFIX: Final = "idempotency_store_"


@dataclass(frozen=True, slots=True)
class Reading:
    """One reading of ``idem_health``: its rows, or None when it failed."""

    rows: tuple[tuple[Any, ...], ...] | None
    seconds: float


def _age(value: Any) -> float:
    return 0.0 if value is None else float(value.total_seconds())


class StoreHealthCollector(Collector):
    """A Prometheus collector over ``idem_health``, one reading per interval.

    ``read`` runs the query and returns its rows (``Store.health_rows``); ``on_error`` counts a
    failed reading (``Metrics.record_store_error``).
    """

    def __init__(
        self,
        read: Callable[[], Iterable[tuple[Any, ...]]],
        on_error: Callable[[str, str], None],
        interval_seconds: float,
    ) -> None:
        self._read = read
        self._on_error = on_error
        self._interval = interval_seconds
        self._lock = threading.Lock()
        self._reading: Reading | None = None
        self._read_at = 0.0

    def describe(self) -> list[Metric]:
        # Names only, so registering the collector never runs the query.
        return [family for family in self._families(Reading(rows=None, seconds=0.0))]

    def collect(self) -> Iterator[Metric]:
        yield from self._families(self.reading())

    def reading(self) -> Reading:
        """The last reading, taken again when it is older than the interval."""
        with self._lock:  # concurrent scrapes share one query
            now = monotonic()
            if self._reading is None or now - self._read_at >= self._interval:
                self._reading = self._take()
                self._read_at = now
            return self._reading

    def _take(self) -> Reading:
        started = perf_counter()
        try:
            rows = tuple(tuple(row) for row in self._read())
        except Exception as exc:  # whatever went wrong, /metrics must still answer
            self._on_error("", STAGE)
            logger.warning("idem_health could not be read for the store gauges: %s", _first_line(exc))
            return Reading(rows=None, seconds=perf_counter() - started)
        return Reading(rows=rows, seconds=perf_counter() - started)

    @staticmethod
    def _families(reading: Reading) -> Iterator[Metric]:
        up = GaugeMetricFamily(_PREFIX + "health_up", "1 when the last reading of idem_health succeeded, else 0.")
        took = GaugeMetricFamily(_PREFIX + "health_query_seconds", "Duration of the last reading of idem_health.")
        up.add_metric([], 0.0 if reading.rows is None else 1.0)
        took.add_metric([], reading.seconds)
        yield up
        yield took

        rows = GaugeMetricFamily(_PREFIX + "rows", "Rows in the store by endpoint scope and status.", labels=_KEYS)
        expired = GaugeMetricFamily(
            _PREFIX + "expired_rows",
            "Rows past expires_at still in the store (the cleanup deletes them).",
            labels=_KEYS,
        )
        oldest = GaugeMetricFamily(_PREFIX + "oldest_row_seconds", "Age of the oldest row.", labels=_KEYS)
        stale = GaugeMetricFamily(
            _PREFIX + "stale_in_flight",
            "In-flight rows whose lease is older than 30 s and that no duplicate has healed.",
            labels=["endpoint"],
        )
        lease = GaugeMetricFamily(
            _PREFIX + "oldest_lease_seconds", "Age of the oldest in-flight lease.", labels=["endpoint"]
        )
        events = GaugeMetricFamily(
            _PREFIX + "events_24h",
            "Events of the last 24 hours (stale_heal, lost_claim, released, erasure) by endpoint scope.",
            labels=["endpoint", "event"],
        )
        for kind, named, state, total, n_stale, n_expired, age, lease_age, _latest in reading.rows or ():
            endpoint = OTHER_SCOPE if named is None else named
            if kind == "event":
                events.add_metric([endpoint, state], float(total))
                continue
            rows.add_metric([endpoint, state], float(total))
            expired.add_metric([endpoint, state], float(n_expired or 0))
            oldest.add_metric([endpoint, state], _age(age))
            if state == "in_flight":
                stale.add_metric([endpoint], float(n_stale or 0))
                lease.add_metric([endpoint], _age(lease_age))
        yield from (rows, expired, oldest, stale, lease, events)


_KEYS: Final = ["endpoint", "status"]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
