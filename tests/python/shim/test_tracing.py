"""OpenTelemetry spans of decorated requests, read from the SDK's in-memory exporter.

Cases: a claimed request (idem.request > idem.claim outcome claimed, idem.complete completed, one
trace), its replay (idem.claim outcome replay, idem.replay with the stored status, replayed
true), the same key with another body (idem.claim outcome mismatch, nothing else), and a handler
that raises (idem.fail with error-free attributes, the exception's class on idem.request). No
attribute of any span carries the key, the user id or anything of the body. (Without the package
nothing is imported: scripts/test_wheel.sh checks that in a venv without it.)
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from idem_shim import tracing
from tests.python.support.shim import AppFactory, Order, post

SECRET = "body-marker-that-must-never-be-traced"
ENDPOINT = "POST /orders"
_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def provider() -> None:
    # Set once per process (the API refuses a second provider); the shim's tracer is a proxy
    # that follows it.
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    trace.set_tracer_provider(tp)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def by_name(finished: tuple[ReadableSpan, ...] | list[ReadableSpan]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for span in finished:
        out.setdefault(span.name, []).append(dict(span.attributes or {}))
    return out


def assert_nothing_private(finished: Any, key: str) -> None:
    for span in finished:
        for value in (span.attributes or {}).values():
            text = str(value)
            assert key not in text and SECRET not in text, f"{span.name} carries {text!r}"
        assert set(span.attributes or {}) <= {
            "idem.endpoint",
            "idem.outcome",
            "idem.replayed",
            "idem.attempt",
            "http.response.status_code",
            "error.type",
        }


def test_claimed_replayed_and_mismatched_requests(make_app: AppFactory, spans: InMemorySpanExporter) -> None:
    assert tracing.enabled()
    client = make_app().test_client()
    key = str(uuid.uuid4())
    body = {"item": SECRET}

    assert post(client, "/orders", key, body).status_code == 201
    claimed = spans.get_finished_spans()
    got = by_name(claimed)
    assert got["idem.claim"] == [{"idem.endpoint": ENDPOINT, "idem.outcome": "claimed", "idem.replayed": False}]
    assert got["idem.complete"] == [
        {"idem.endpoint": ENDPOINT, "http.response.status_code": 201, "idem.outcome": "completed", "idem.attempt": 1}
    ]
    assert got["idem.request"] == [{"idem.endpoint": ENDPOINT, "idem.outcome": "claimed", "idem.replayed": False}]
    assert "idem.replay" not in got
    request_span = next(s for s in claimed if s.name == "idem.request")
    for span in claimed:  # one trace: claim and completion are children of the request's span
        assert span.context is not None and request_span.context is not None
        assert span.context.trace_id == request_span.context.trace_id
        if span is not request_span:
            assert span.parent is not None and span.parent.span_id == request_span.context.span_id
    spans.clear()

    again = post(client, "/orders", key, body)
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
    replayed = spans.get_finished_spans()
    got = by_name(replayed)
    assert got["idem.claim"] == [{"idem.endpoint": ENDPOINT, "idem.outcome": "replay", "idem.replayed": True}]
    assert got["idem.replay"] == [
        {"idem.endpoint": ENDPOINT, "idem.outcome": "replay", "idem.replayed": True, "http.response.status_code": 201}
    ]
    assert "idem.complete" not in got and "idem.fail" not in got
    spans.clear()

    assert post(client, "/orders", key, {"item": "other"}).status_code == 422
    mismatched = spans.get_finished_spans()
    got = by_name(mismatched)
    assert got["idem.claim"] == [{"idem.endpoint": ENDPOINT, "idem.outcome": "mismatch", "idem.replayed": False}]
    assert set(got) == {"idem.request", "idem.claim"}

    for finished in (claimed, replayed, mismatched):
        assert_nothing_private(finished, key)


def raises(order: Order) -> Any:
    raise RuntimeError(f"handler broke on {SECRET}")


def test_a_failing_handler_leaves_an_idem_fail_span(make_app: AppFactory, spans: InMemorySpanExporter) -> None:
    client = make_app(raises).test_client()
    key = str(uuid.uuid4())
    assert post(client, "/orders", key, {"item": SECRET}).status_code == 500
    finished = spans.get_finished_spans()
    got = by_name(finished)
    assert got["idem.fail"] == [{"idem.endpoint": ENDPOINT, "idem.outcome": "failed", "idem.attempt": 1}]
    assert got["idem.request"][0]["error.type"] == "RuntimeError"
    assert "idem.complete" not in got
    assert_nothing_private(finished, key)
