"""The app's decorated routes, read from its URL map: their scopes (checked once; the store
gauges name them, ``health_gauges.py``) and policies (the OpenAPI document, ``openapi.py``).

A key is scoped by ``(key, user, endpoint scope)``. Two routes with the same scope share their
keys: a retry sent to either replays the other's answer. That is the point of ``scope=`` when a
route is renamed or re-versioned (the old and the new URL both declare ``scope="orders.place"``),
and a silent double booking when it happens by accident (a route declares
``scope="POST /api/orders"``, another route's default). So a shared scope is refused unless
every route holding it declares it explicitly.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from flask import Flask

from .config import validate_scope
from .errors import ConfigError

if TYPE_CHECKING:
    from .policy import Policy

#: Methods Flask adds to a rule by itself: never a write, never idempotency-tracked.
_IMPLICIT_METHODS: Final = frozenset({"HEAD", "OPTIONS"})


@dataclass(frozen=True, slots=True)
class DecoratedRoute:
    """One (URL rule, method) of a view wrapped by ``@idempotency_key``."""

    rule: str
    method: str
    endpoint: str
    policy: Policy

    @property
    def scope(self) -> str:
        """The key's endpoint scope: the declared one, else ``"<METHOD> <url rule>"``."""
        return self.policy.scope or f"{self.method} {self.rule}"


def decorated_routes(app: Flask) -> Iterator[DecoratedRoute]:
    """Every (rule, method) whose view carries an idempotency policy, in URL-map order.

    Outer decorators made with ``functools.wraps`` copy the view's ``__dict__``, so the policy
    is found on the registered view whatever wraps the decorator (``@require_session``)."""
    for rule in app.url_map.iter_rules():
        view = app.view_functions.get(rule.endpoint)
        policy = getattr(view, "idempotency_policy", None)
        if policy is None:
            continue
        for method in sorted((rule.methods or set()) - _IMPLICIT_METHODS):
            yield DecoratedRoute(rule.rule, method, rule.endpoint, policy)


def declared_scopes(app: Flask) -> frozenset[str]:
    """The scopes of the app's decorated routes: what the store gauges name (bounded by code)."""
    return frozenset(route.scope for route in decorated_routes(app))


def check_routes(app: Flask) -> None:
    """Refuse a scope held by two routes unless every one of them declares it, and a default
    scope (``"<METHOD> <rule>"``) that idem_claim would refuse (ConfigError).

    Run by ``Idem.init_app`` (refusing the start-up) and again on the first tracked request, for
    routes registered after ``init_app`` (that request answers 500 with the same message)."""
    holders: defaultdict[str, list[DecoratedRoute]] = defaultdict(list)
    for route in decorated_routes(app):
        if route.policy.scope is None:  # a declared one was checked by Policy
            try:
                validate_scope(route.scope)
            except ValueError as exc:
                raise ConfigError(
                    f"idem_shim: the route {route.method} {route.rule[:60]!r} cannot be its own idempotency scope "
                    f"({exc}): declare @idempotency_key(scope=...) with a short name"
                ) from None
        holders[route.scope].append(route)
    for scope, routes in holders.items():
        if len(routes) > 1 and any(route.policy.scope is None for route in routes):
            names = ", ".join(f"{r.method} {r.rule}" for r in routes)
            raise ConfigError(
                f"idem_shim: the routes {names} share the idempotency scope {scope!r}, so they would share "
                f"their keys; declare @idempotency_key(scope={scope!r}) on each of them if that is meant, "
                "or give one a scope of its own"
            )
