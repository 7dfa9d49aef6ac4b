"""How long a duplicate should wait (contract §4's in-flight row): the time the holder probably still
needs, from the durations this process observed for the scope and the holder's elapsed time.

Each process keeps, per endpoint scope, a smoothed duration of the claimed executions it ran (the
claim to the end of the completion) and its smoothed deviation: RFC 6298's estimator of a round
trip, updated in a few float operations per execution. A duplicate of a holder that has held the
key for ``elapsed`` ms is told ``mean + deviation - elapsed``: when the holder will likely be done.
A holder already past its usual time is taken to need about as long again as it has taken so far.
A scope this process has not run yet says nothing of the holder (in a gunicorn of several
workers, a new route's first minutes: each worker learns it apart): the duplicate is told to poll
soon, as long again as so far but at most ``UNSEEN_SCOPE_MAX_MS`` (``Retry-After: 1``), where "as
long again" alone told a client retrying on ``Retry-After`` 1, 2, 4 s for a holder done in 1.1 s,
overshooting by up to the holder's whole time. The claim's own
``retry_after_ms`` (the lease left, at most 5000) caps the answer, so a stuck holder is never
waited for past its lease; ``FLOOR_MS`` keeps a retry from arriving before anything can change.
"""

from __future__ import annotations

import math
from typing import Final

#: The shortest wait a duplicate is told: about a round trip and a commit of the holder's.
FLOOR_MS: Final = 50
#: The longest wait a duplicate is told for a scope this process has no duration of: one second,
#: the least ``Retry-After`` says, so a client polls once a second until the worker has learnt it.
UNSEEN_SCOPE_MAX_MS: Final = 1000
#: RFC 6298's gains: the mean follows 1/8 of each new error, the deviation 1/4.
_MEAN_GAIN: Final = 0.125
_DEVIATION_GAIN: Final = 0.25


class HandlerDurations:
    """The durations of one process's claimed executions, per endpoint scope (milliseconds)."""

    __slots__ = ("_by_scope",)

    def __init__(self) -> None:
        self._by_scope: dict[str, list[float]] = {}  # scope -> [mean, deviation]

    def record(self, scope: str, seconds: float) -> None:
        """One execution of ``scope`` took ``seconds`` from its claim to its completion."""
        ms = seconds * 1000.0
        estimate = self._by_scope.get(scope)
        if estimate is None:
            self._by_scope[scope] = [ms, ms / 4]
            return
        error = ms - estimate[0]
        estimate[0] += _MEAN_GAIN * error
        estimate[1] += _DEVIATION_GAIN * (abs(error) - estimate[1])

    def usual_ms(self, scope: str) -> float | None:
        """When an execution of ``scope`` is likely done (mean + deviation), None before the first."""
        estimate = self._by_scope.get(scope)
        return None if estimate is None else estimate[0] + estimate[1]

    def retry_after_ms(self, scope: str, holder_elapsed_ms: int | None, lease_ms: int) -> int:
        """What a duplicate of a holder ``holder_elapsed_ms`` into its work is told: between
        ``FLOOR_MS`` and ``lease_ms`` (never past the holder's lease, never below 0). A store too
        old to say the holder's time (None) leaves the lease."""
        if holder_elapsed_ms is None:
            return lease_ms
        usual = self.usual_ms(scope)
        if usual is None:  # unseen: as long again, polled at least once a second
            remaining = float(min(holder_elapsed_ms, UNSEEN_SCOPE_MAX_MS))
        else:
            remaining = usual - holder_elapsed_ms
            if remaining <= 0:
                remaining = holder_elapsed_ms  # late: about as long again as so far
        return max(0, min(lease_ms, max(FLOOR_MS, math.ceil(remaining))))
