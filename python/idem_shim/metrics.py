"""Prometheus metrics of the shim, registered in a registry the app exposes at /metrics.

Each app gets its own ``CollectorRegistry`` unless it passes one to ``Idem``; that keeps two apps
in one process (tests, or an app factory called twice) from colliding on metric names.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any, Final

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, multiprocess
from prometheus_client import generate_latest as _generate_latest

from .health_gauges import StoreHealthCollector
from .outcome import Outcome

#: Outcomes of idem_claim that count as a hit (a duplicate of an earlier request): all but claimed.
HIT_OUTCOMES: Final = frozenset(Outcome) - {Outcome.CLAIMED}

_LATENCY_BUCKETS: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)


class Metrics:
    """The shim's counters and its claim-latency histogram."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.miss = Counter(
            "idempotency_miss",
            "Requests whose key was claimed for the first time (the handler ran).",
            ["endpoint"],
            registry=self.registry,
        )
        self.hit = Counter(
            "idempotency_hit",
            "Requests whose key was already known (any duplicate), by claim outcome.",
            ["endpoint", "outcome"],
            registry=self.registry,
        )
        self.replay = Counter(
            "idempotency_replay",
            "Duplicates answered with the stored response.",
            ["endpoint"],
            registry=self.registry,
        )
        self.store_errors = Counter(
            "idempotency_store_errors",
            "Failures to reach or use the idempotency store, by step (claim, complete, fail).",
            ["endpoint", "stage"],
            registry=self.registry,
        )
        self.stale_heals = Counter(
            "idempotency_stale_heals",
            "Stale in-flight holders freed by a claim (their worker died or hung).",
            ["endpoint"],
            registry=self.registry,
        )
        self.released = Counter(
            "idempotency_released",
            'Failed executions whose key was freed for the retry (on_failure="release").',
            ["endpoint"],
            registry=self.registry,
        )
        self.claim_seconds = Histogram(
            "idempotency_claim_seconds",
            "Time to take a pooled connection and run idem_claim, by outcome.",
            ["endpoint", "outcome"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )

        #: The store gauges alone (``watch_store``): a multiprocess /metrics (gunicorn) sums the
        #: workers' counters from files and appends this registry's text, read by one worker.
        self.store_registry = CollectorRegistry(auto_describe=True)
        self.store_health: StoreHealthCollector | None = None

        # The children of the per-request metrics, by label values: .labels() validates and
        # locks on every call; the same endpoints and outcomes repeat forever (bounded set).
        self._children: dict[tuple[str, Outcome], tuple[Any, ...]] = {}

    def _outcome_children(self, endpoint: str, outcome: Outcome) -> tuple[Any, ...]:
        """The claim-latency child, then every counter this outcome increments."""
        children: list[Any] = [self.claim_seconds.labels(endpoint, outcome)]
        if outcome == Outcome.CLAIMED:
            children.append(self.miss.labels(endpoint))
        if outcome in HIT_OUTCOMES:
            children.append(self.hit.labels(endpoint, outcome))
        if outcome == Outcome.REPLAY:
            children.append(self.replay.labels(endpoint))
        elif outcome == Outcome.STALE:
            children.append(self.stale_heals.labels(endpoint))
        return tuple(children)

    def record_claim(self, endpoint: str, outcome: Outcome, seconds: float) -> None:
        children = self._children.get((endpoint, outcome))
        if children is None:
            children = self._children[(endpoint, outcome)] = self._outcome_children(endpoint, outcome)
        children[0].observe(seconds)
        for counter in children[1:]:
            counter.inc()

    def record_released(self, endpoint: str) -> None:
        self.released.labels(endpoint).inc()

    def record_store_error(self, endpoint: str, stage: str) -> None:
        self.store_errors.labels(endpoint, stage).inc()

    def watch_store(self, read: Callable[[], Iterable[tuple[Any, ...]]], interval_seconds: float) -> None:
        """Export the ``idempotency_store_*`` gauges, read by ``read`` at scrape time."""
        self.store_health = StoreHealthCollector(read, self.record_store_error, interval_seconds)
        self.registry.register(self.store_health)
        self.store_registry.register(self.store_health)

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type, for a ``GET /metrics`` view.

        Under gunicorn each worker counts apart: with prometheus_client's multiprocess directory
        (``PROMETHEUS_MULTIPROC_DIR``, set before the workers start) it is every worker's counters
        summed from their files, then the store's gauges as this worker reads them (one store,
        one figure); otherwise this registry."""
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            summed = CollectorRegistry()
            multiprocess.MultiProcessCollector(summed)  # type: ignore[no-untyped-call]
            return _generate_latest(summed) + _generate_latest(self.store_registry), CONTENT_TYPE_LATEST
        return _generate_latest(self.registry), CONTENT_TYPE_LATEST
