"""The start-up checks of the store: the SQL API is installed, recent enough and open to this
role; the URL reaches a primary; and whether completions go through ``idem_complete_in_scope``
(a distributed store).

Run once at ``init_app`` when the database answers, else on the pool's first connection
(``on_new_connection``, until one check has passed).
"""

from __future__ import annotations

import logging

import psycopg
from psycopg.rows import TupleRow

from . import queries
from .config import Settings
from .errors import SchemaError
from .pool import connect_kwargs

logger = logging.getLogger("idem_shim")

Conn = psycopg.Connection[TupleRow]


class SchemaCheck:
    """What the start-up checks found, for the store to read."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.verified = False
        #: whether completions go through idem_complete_in_scope (a distributed store); None:
        #: not known yet (``verify`` learns it, else the first completion asks)
        self.complete_in_scope: bool | None = None

    def on_new_connection(self, conn: Conn) -> None:
        """The pool's ``configure``: every new connection until the schema has been verified once."""
        if self.settings.check_schema and not self.verified:
            try:
                self.verify(conn)
            except SchemaError as exc:
                logger.error("idempotency schema check failed: %s", exc)
                conn.close()
                raise

    def learn_complete_in_scope(self, conn: Conn) -> bool:
        row = conn.execute(queries.HAS_COMPLETE_IN_SCOPE).fetchone()
        self.complete_in_scope = bool(row and row[0])
        return self.complete_in_scope

    def verify(self, conn: Conn) -> int:
        """Check that the SQL API is installed, recent enough and open to this role; return its version."""
        expected = queries.EXPECTED_SCHEMA_VERSION
        row = conn.execute(queries.SCHEMA_VERSION).fetchone()
        assert row is not None  # one row, always
        if row[0] is None:
            raise SchemaError(
                "public.idem_schema_version() does not exist in this database: the idempotency SQL API "
                "is not installed. Apply it (idem migrate --database-url URL, or the script "
                "`idem sql` prints, through psql) before starting the app."
            )
        if not row[1]:
            raise SchemaError(
                "this role may not execute the idempotency SQL API: make the app's login role a "
                "member of idem_app (CREATE ROLE ... IN ROLE idem_app / GRANT idem_app TO ...)."
            )
        version = int(row[0])
        if version < expected:
            raise SchemaError(
                f"idempotency SQL API version {version} is older than the {expected} this code "
                "needs: run the migrations before deploying this code."
            )
        self.learn_complete_in_scope(conn)
        self.verified = True
        return version

    def at_startup(self) -> None:
        """Verify the schema now if the database answers; if it does not, say so and go on."""
        try:
            with psycopg.connect(self.settings.database_url, **connect_kwargs(self.settings)) as conn:
                self.verify(conn)
                _warn_if_read_only(conn)
        except SchemaError:
            raise
        except psycopg.OperationalError as exc:
            if self._reaches_only_read_only():
                return
            logger.warning(
                "idempotency store unreachable at start-up (%s); decorated routes answer as if "
                "the store were down until it is back, and the schema is checked on the first "
                "connection",
                str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
            )

    def _reaches_only_read_only(self) -> bool:
        """After a failed start-up connection: do the URL's servers answer, only read-only
        (``target_session_attrs=read-write`` found no primary among them)?"""
        try:
            with psycopg.connect(
                self.settings.database_url, **connect_kwargs(self.settings), target_session_attrs="any"
            ) as conn:
                return _warn_if_read_only(conn)
        except psycopg.Error:
            return False


def _warn_if_read_only(conn: Conn) -> bool:
    """A WARNING when ``conn`` reached a standby or a read-only server: every claim would
    answer 25006, so Tier 1 answers 503 until a primary is reachable."""
    row = conn.execute(
        "SELECT pg_catalog.pg_is_in_recovery(),"
        " pg_catalog.current_setting('transaction_read_only') OPERATOR(pg_catalog.=) 'on'"
    ).fetchone()
    if not row or not (row[0] or row[1]):
        return False
    logger.warning(
        "idempotency store: the database URL reaches only a read-only server (%s:%s is %s): "
        "decorated routes answer as if the store were down (Tier 1: 503) until a primary is "
        "reachable; name every node of the cluster with target_session_attrs=read-write",
        conn.info.host,
        conn.info.port,
        "a standby in recovery" if row[0] else "read-only by default_transaction_read_only",
    )
    return True
