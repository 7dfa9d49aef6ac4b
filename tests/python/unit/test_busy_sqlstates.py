"""What the breaker and ``on_failure="replay"`` read of an error, without a server.

``server_answered``: a failed connection attempt the server refused with an error of its own
(libpq frames it ``<severity>:  <message>``, in any locale) is the store up; libpq's own reasons
(refused, timeout, no such host, closed) are the store down. ``transient_rollback``: a
serialization failure or a deadlock, raised as it is or as the cause of the handler's own
exception. The same against a real server: tests/python/shim/test_busy_not_down.py and
test_client_options.py.
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg import errors as pg_errors

from idem_shim import sqlstates

AT = 'connection failed: connection to server at "10.0.0.5", port 5432 failed: '


@pytest.mark.parametrize(
    ("message", "answered"),
    [
        (AT + 'FATAL:  too many connections for role "web"', True),
        (AT + "FATAL:  sorry, too many clients already", True),
        (AT + "FATAL:  the database system is starting up", True),
        (AT + 'FATAL:  password authentication failed for user "web"', True),
        (AT + "FATAL:  no more connections allowed (max_client_conn)", True),  # PgBouncer
        (AT + "SCHWERWIEGEND:  zu viele Verbindungen für Rolle »web«", True),  # a server in German
        (AT + "Connection refused\n\tIs the server running on that host and accepting TCP/IP connections?", False),
        (AT + "timeout expired", False),
        (
            AT + "server closed the connection unexpectedly\n\tThis probably means the server terminated abnormally",
            False,
        ),
        ('connection failed: could not translate host name "db.internal" to address: Name or service not known', False),
        (AT + "session is read-only", False),  # target_session_attrs found no primary: libpq's own
        (
            AT + "Connection refused\n\tIs the server running?\n"
            'connection to server at "10.0.0.6", port 5432 failed: FATAL:  the database system is shutting down',
            True,
        ),
    ],
)
def test_a_connection_error_the_server_sent_is_the_server_answering(message: str, answered: bool) -> None:
    assert sqlstates.server_answered(psycopg.OperationalError(message)) is answered


def test_an_error_with_a_sqlstate_is_the_server_answering_and_anything_else_is_not() -> None:
    assert sqlstates.server_answered(pg_errors.lookup("53300")("too many connections"))
    assert not sqlstates.server_answered(OSError("FATAL:  not a driver error"))


@pytest.mark.parametrize(("code", "transient"), [("40001", True), ("40P01", True), ("23505", False), ("57014", False)])
def test_a_serialization_failure_or_a_deadlock_is_transient_as_raised_or_as_a_cause(code: str, transient: bool) -> None:
    exc = pg_errors.lookup(code)("the server said so")
    assert sqlstates.transient_rollback(exc) is transient
    try:
        try:
            raise exc
        except psycopg.Error as inner:
            raise RuntimeError("the transfer could not be booked") from inner
    except RuntimeError as outer:
        assert sqlstates.transient_rollback(outer) is transient
    assert not sqlstates.transient_rollback(ValueError("no database"))
