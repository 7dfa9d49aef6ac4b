"""What ``claim="in_transaction"`` refuses when a view or a job is decorated (contract §4e).

Such a claim commits with the work, so there is no committed claim to renew (``heartbeat()``)
and no retry across a stale heal whose downstream call needs deduping (``downstream_key()``):
a view that names either is refused when it is decorated, with ``ConfigError``. The check reads
the names the function's code (and the code nested in it) loads: it sees
``idem_shim.heartbeat()``, ``from idem_shim import downstream_key`` and their aliases, not a
call made through a helper of another module; those are refused at the call
(``scope.refuse_in_transaction``).
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from typing import Any

from .errors import ConfigError

#: The accessors for work that leaves the database.
REFUSED = ("downstream_key", "heartbeat")


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _names(function: Callable[..., Any]) -> set[str]:
    code = getattr(function, "__code__", None)
    if code is None:
        return set()
    return {name for c in _codes(code) for name in c.co_names}


def _is_the_package(value: object) -> bool:
    return isinstance(value, types.ModuleType) and value.__name__ == "idem_shim"


def refuse_lease_calls(function: Callable[..., Any], entry: str) -> None:
    """``ConfigError`` when ``function`` (under ``functools.wraps`` layers too) names
    ``idem_shim.downstream_key`` or ``idem_shim.heartbeat``."""
    from . import scope  # the package's own accessors, by identity (an app's own heartbeat is not one)

    accessors = {name: getattr(scope, name) for name in REFUSED}
    seen: Callable[..., Any] | None = function
    while seen is not None:
        names = _names(seen)
        globals_ = getattr(seen, "__globals__", {})
        for name in REFUSED:
            direct = any(globals_.get(n) is accessors[name] for n in names)
            through_module = name in names and any(_is_the_package(globals_.get(n)) for n in names)
            if direct or through_module:
                raise ConfigError(
                    f"{entry}(claim='in_transaction') on {function.__qualname__}: it calls idem_shim.{name}(), "
                    "which is for work that leaves the database; use claim='before' (the default) there "
                    "(contract §4e)"
                )
        seen = getattr(seen, "__wrapped__", None)
