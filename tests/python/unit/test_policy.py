"""The options of a route and a job, declared once (idem_shim/policy.py): each is checked when it
is declared, documented in docs/shim.md's table exactly as declared, shown by ``inspect`` on both
entry points, published in full in the OpenAPI ``x-idempotency`` object, and a job refuses the
options that only a route has. No database needed."""

from __future__ import annotations

import inspect
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from idem_shim import idempotency_key, idempotent
from idem_shim.config import Settings
from idem_shim.errors import ConfigError
from idem_shim.openapi import document
from idem_shim.policy import Policy, reference_table
from idem_shim.routes import check_routes, declared_scopes

ROOT = Path(__file__).resolve().parents[3]
OPTIONS = [spec.name for spec in fields(Policy) if spec.init]
#: The options are checked before ``db``: no database is needed to see them refused.
NO_DB: Any = None


def test_docs_shim_md_carries_the_options_table_as_declared() -> None:
    assert reference_table() in (ROOT / "docs" / "shim.md").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"ttl_hours": 0}, ValueError, "ttl_hours must be in"),
        ({"ttl_hours": 169}, ValueError, "ttl_hours must be in"),
        ({"ttl_hours": "24"}, TypeError, "ttl_hours must be a number"),
        ({"wait_ms": -1}, ValueError, "wait_ms must be in"),
        ({"wait_ms": 60_001}, ValueError, "wait_ms must be in"),
        ({"stale_after_seconds": 0}, ValueError, "stale_after_seconds must be at least 1"),
        ({"stale_after_seconds": 0.5}, ValueError, "stale_after_seconds must be at least 1"),
        ({"on_stale": "ignore"}, ValueError, "on_stale must be"),
        ({"on_failure": "retry"}, ValueError, "on_failure must be"),
        ({"scope": " padded"}, ValueError, "scope must be"),
        ({"ttl_hour": 24}, TypeError, "unexpected option 'ttl_hour'"),
    ],
)
def test_a_bad_option_is_refused_at_declaration_on_both_entry_points(
    options: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        idempotency_key(**options)
    with pytest.raises(error, match=match):
        idempotent(db=NO_DB, **{"scope": "jobs.bad", **options})


@pytest.mark.parametrize("route_only", ["fail_closed", "required", "store_response", "service"])
def test_a_job_refuses_the_options_only_a_route_has(route_only: str) -> None:
    with pytest.raises(TypeError, match=f"idempotent\\(\\) got an unexpected option '{route_only}'"):
        route_option: dict[str, Any] = {route_only: True}
        idempotent(db=NO_DB, scope="jobs.x", **route_option)


def test_a_route_flag_must_be_true_or_false() -> None:
    with pytest.raises(TypeError, match="fail_closed must be True or False"):
        idempotency_key(fail_closed="no")


def test_a_job_needs_a_scope() -> None:
    with pytest.raises(TypeError, match="needs scope="):
        idempotent(db=NO_DB)


def test_both_entry_points_show_the_options_in_their_signature() -> None:
    route = inspect.signature(idempotency_key).parameters
    job = inspect.signature(idempotent).parameters
    assert list(route) == OPTIONS
    assert list(job)[:3] == ["db", "key", "user"]
    job_options = {spec.name for spec in fields(Policy) if spec.init and spec.metadata["job"]}
    assert set(job) - {"db", "key", "user"} == job_options
    assert {"fail_closed", "required", "store_response", "service"}.isdisjoint(job_options)
    assert job["scope"].default is inspect.Parameter.empty and route["scope"].default is None


def test_unset_defaults_come_from_the_settings() -> None:
    policy = Policy()
    settings = Settings(wait_ms=250, stale_after_seconds=12)
    assert policy.wait_ms_for(settings) == 250 and policy.stale_after_for(settings).total_seconds() == 12
    declared = Policy(wait_ms=0, stale_after_seconds=3)
    assert declared.wait_ms_for(settings) == 0 and declared.stale_after_for(settings).total_seconds() == 3


def test_x_idempotency_publishes_every_option() -> None:
    app = Flask("policy")

    @app.post("/orders")
    @idempotency_key(ttl_hours=2, wait_ms=1500, scope="orders.place")
    def place() -> Any:
        return {}, 201

    published = document(app)["paths"]["/orders"]["post"]["x-idempotency"]
    expected = {"ttl_seconds" if name == "ttl_hours" else name for name in OPTIONS}
    assert expected <= set(published)
    assert published["ttl_seconds"] == 7200 and published["wait_ms"] == 1500 and published["scope"] == "orders.place"
    assert published["stale_after_seconds"] == Settings().stale_after_seconds


def test_other_is_no_scope() -> None:
    """The store gauges' ``other`` sums every undeclared endpoint: a route declaring it would
    make two series of one name (issue 39, F5)."""
    with pytest.raises(ValueError, match="reserved"):
        idempotency_key(scope="other")
    with pytest.raises(ValueError, match="reserved"):
        idempotent(db=None, scope="other")  # type: ignore[arg-type]


def test_a_default_scope_idem_claim_would_refuse_is_refused_at_registration() -> None:
    """A route with no scope= is its own "METHOD /rule": a rule too long for idem_claim's 200
    characters is a ConfigError when the routes are checked, not a 500 per request."""
    app = Flask("long_rule")
    app.add_url_rule("/" + "x" * 300, "long", idempotency_key()(lambda: "ok"), methods=["POST"])
    with pytest.raises(ConfigError, match="cannot be its own idempotency scope"):
        check_routes(app)
    app = Flask("long_rule_declared")
    app.add_url_rule("/" + "x" * 300, "long", idempotency_key(scope="long.rule")(lambda: "ok"), methods=["POST"])
    check_routes(app)
    assert declared_scopes(app) == {"long.rule"}
