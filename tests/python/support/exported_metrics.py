"""The metric names the shim exports, read from a real exposition (no database), and the metric
names a PromQL expression mentions: what the alert rules and the dashboard may refer to."""

from __future__ import annotations

import re
from datetime import timedelta

from prometheus_client.parser import text_string_to_metric_families

from idem_shim.metrics import Metrics
from idem_shim.outcome import Outcome

#: One row of each kind idem_health returns, so that every store gauge has a sample.
_HEALTH_ROWS = [
    ("keys", "POST /orders", "completed", 3, 0, 1, timedelta(hours=2), None, None),
    ("keys", "POST /orders", "in_flight", 1, 1, 0, timedelta(minutes=5), timedelta(minutes=5), None),
    ("event", "POST /orders", "stale_heal", 1, None, None, timedelta(minutes=1), None, None),
]

_NAME = re.compile(r"\bidempotency_[a-zA-Z0-9_]+")


def exported_sample_names() -> set[str]:
    """Every sample name of /metrics once each metric has a value (``*_total``, ``*_bucket``, ...)."""
    metrics = Metrics()
    for outcome in Outcome:
        metrics.record_claim("POST /orders", outcome, 0.002)
    metrics.record_store_error("POST /orders", "claim")
    metrics.watch_store(lambda: _HEALTH_ROWS, 60)
    text, _ = metrics.render()
    return {s.name for family in text_string_to_metric_families(text.decode()) for s in family.samples}


def names_in(expr: str) -> set[str]:
    """The ``idempotency_*`` metric names a PromQL expression selects."""
    return set(_NAME.findall(expr))
