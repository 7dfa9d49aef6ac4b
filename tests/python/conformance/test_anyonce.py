"""anyonce's HTTP conformance vectors for the IETF draft, as published, against idem.

The vectors are data (tests/conformance/anyonce/vectors/, copied verbatim; its README names the
source): each one runs against the fixture app (fixture_app.py) behind idem's decorator in the
documented configuration, served by a real server on a fresh database. This runner follows the
execution rules of anyonce's conformance/README.md: ``POST /reset`` before every vector; steps in
order; a step named in a later step's ``concurrentWith`` is sent and left pending, the later step
waits its ``delayMs`` and is sent while those are pending, and the group is checked together with
one ``GET /counter`` read; ``handlerInvocations`` is that read; ``bodyEquals: {sameAs}`` compares
bytes with an earlier step's body; header names match without regard to case.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import jsonschema  # type: ignore[import-untyped]  # openapi-spec-validator brings it, without stubs
import pytest
import requests

from tests.python.conformance.fixture_app import make_fixture_app, serve

ROOT: Final = Path(__file__).resolve().parents[3] / "tests" / "conformance" / "anyonce"
VECTORS: Final = sorted((ROOT / "vectors").glob("*/*.json"))
SCHEMA: Final = json.loads((ROOT / "schema.json").read_text(encoding="utf-8"))

#: Vectors idem answers otherwise by design, each with its reason (docs/shim.md, **Conformance**).
#: None: all 11 pass as published.
DIFFER_BY_DESIGN: Final[dict[str, str]] = {}


@dataclass(frozen=True, slots=True)
class Observed:
    status: int
    headers: requests.structures.CaseInsensitiveDict[str]
    body: bytes


def _send(base: str, request: dict[str, Any]) -> Observed:
    body = request.get("body")
    answer = requests.request(
        request["method"],
        base + request["path"],
        headers=request.get("headers", {}),
        data=None if body is None else body.encode("utf-8"),
        timeout=30,
        allow_redirects=False,
    )
    return Observed(answer.status_code, answer.headers, answer.content)


def _counter(base: str) -> int | None:
    answer = requests.get(base + "/counter", timeout=10)
    if answer.status_code != 200:
        return None
    count = answer.json().get("count")
    return count if isinstance(count, int) else None


def _header_failure(name: str, expected: Any, headers: Any) -> str | None:
    actual = headers.get(name)
    if isinstance(expected, str):
        return None if actual == expected else f"header {name}: expected {expected!r}, got {actual!r}"
    if "present" in expected:
        return None if actual is not None else f"header {name}: expected present, got absent"
    if "absent" in expected:
        return None if actual is None else f"header {name}: expected absent, got {actual!r}"
    if actual is None or re.search(expected["regex"], actual) is None:
        return f"header {name}: expected /{expected['regex']}/, got {actual!r}"
    return None


def _failures(expect: dict[str, Any], seen: Observed, prior: dict[str, bytes], invocations: int | None) -> list[str]:
    failures = []
    if seen.status != expect["status"]:
        failures.append(f"status: expected {expect['status']}, got {seen.status}")
    for name, expected in expect.get("headers", {}).items():
        failure = _header_failure(name, expected, seen.headers)
        if failure:
            failures.append(failure)
    equals = expect.get("bodyEquals")
    if isinstance(equals, str) and seen.body.decode("utf-8", "replace") != equals:
        failures.append(f"body: expected {equals!r}, got {seen.body[:80]!r}")
    if isinstance(equals, dict) and prior.get(equals["sameAs"]) != seen.body:
        failures.append(f"body: expected the bytes of step {equals['sameAs']}, got {len(seen.body)} bytes that differ")
    if "bodyJson" in expect:
        try:
            parsed = json.loads(seen.body)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            failures.append("body: expected a JSON object")
        else:
            failures += [
                f"body.{k}: expected {v!r}, got {parsed.get(k)!r}"
                for k, v in expect["bodyJson"].items()
                if parsed.get(k) != v
            ]
    if "bodyBytes" in expect and len(seen.body) != expect["bodyBytes"]:
        failures.append(f"body: expected {expect['bodyBytes']} bytes, got {len(seen.body)}")
    if "handlerInvocations" in expect and invocations != expect["handlerInvocations"]:
        failures.append(f"handlerInvocations: expected {expect['handlerInvocations']}, got {invocations}")
    return failures


def run_vector(base: str, vector: dict[str, Any]) -> dict[str, list[str]]:
    """Each step's failures (empty lists: the vector passes)."""
    outcome: dict[str, list[str]] = {}
    prior: dict[str, bytes] = {}
    deferred = {ref for step in vector["steps"] for ref in step.get("concurrentWith", ())}
    pending: dict[str, tuple[dict[str, Any], Future[Observed]]] = {}

    def settle(group: list[tuple[dict[str, Any], Observed]]) -> None:
        needs = any("handlerInvocations" in step["expect"] for step, _ in group)
        invocations = _counter(base) if needs else None
        for step, seen in group:
            outcome[step["id"]] = _failures(step["expect"], seen, prior, invocations)
            prior[step["id"]] = seen.body

    reset = requests.post(base + "/reset", timeout=10)
    assert 200 <= reset.status_code < 300, f"reset answered {reset.status_code}"
    with ThreadPoolExecutor(max_workers=8) as pool:
        for step in vector["steps"]:
            partners = step.get("concurrentWith", [])
            if not partners and pending:
                settle([(s, f.result()) for s, f in pending.values()])
                pending.clear()
            if step.get("delayMs"):
                time.sleep(step["delayMs"] / 1000)
            future = pool.submit(_send, base, step["request"])
            if step["id"] in deferred:
                pending[step["id"]] = (step, future)
                continue
            if partners:
                group = [pending.pop(ref) for ref in partners]
                settle([(s, f.result()) for s, f in group] + [(step, future.result())])
                continue
            settle([(step, future.result())])
        if pending:
            settle([(s, f.result()) for s, f in pending.values()])
    return outcome


@pytest.fixture
def fixture_url(fresh_app_role_url: str) -> Iterator[str]:
    with serve(make_fixture_app(fresh_app_role_url)) as base:
        yield base


def test_the_vectors_are_the_published_eleven_and_well_formed() -> None:
    ids = [json.loads(path.read_text(encoding="utf-8"))["id"] for path in VECTORS]
    assert len(ids) == 11 and len([i for i in ids if i.startswith("core/")]) == 7, ids
    for path in VECTORS:
        jsonschema.validate(json.loads(path.read_text(encoding="utf-8")), SCHEMA)


@pytest.mark.parametrize("path", VECTORS, ids=[f"{p.parent.name}/{p.stem}" for p in VECTORS])
def test_vector(fixture_url: str, path: Path) -> None:
    vector = json.loads(path.read_text(encoding="utf-8"))
    if vector["id"] in DIFFER_BY_DESIGN:
        pytest.xfail(DIFFER_BY_DESIGN[vector["id"]])
    assert not vector.get("requires"), "no vector of this copy needs a capability (short-ttl)"
    outcome = run_vector(fixture_url, vector)
    assert set(outcome) == {step["id"] for step in vector["steps"]}, "every step was checked"
    failed = {step: failures for step, failures in outcome.items() if failures}
    assert not failed, f"{vector['id']}: {failed}"
