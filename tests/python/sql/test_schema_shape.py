"""The store's shape that the preflight holds a foreign table to is the migrations' own
(idem_shim/schema/shape.py reads it from their files): it is exactly what a freshly migrated
database has, and idem's own table, with its migration record removed, shows no difference."""

from __future__ import annotations

import subprocess

import testdb
from idem_shim.schema import STORE_MIGRATION, store_shape
from tests.python.support.sqlapi import connect

COLUMNS = """
SELECT a.attname::text AS name, pg_catalog.format_type(a.atttypid, a.atttypmod) AS type, a.attnotnull AS not_null
  FROM pg_catalog.pg_attribute a
 WHERE a.attrelid = 'public.idempotency_keys'::regclass AND a.attnum > 0 AND NOT a.attisdropped
 ORDER BY a.attnum"""


def test_the_derived_shape_is_a_migrated_databases(fresh_admin_url: str) -> None:
    shape = store_shape()
    with connect(fresh_admin_url) as conn:
        actual = {r["name"]: (r["type"], r["not_null"]) for r in conn.execute(COLUMNS).fetchall()}
        derived = {
            name: (conn.execute("SELECT format_type(%s::regtype, NULL) AS t", (kind,)).fetchone()["t"], not_null)  # type: ignore[index]
            for name, (kind, not_null) in shape.columns.items()
        }
        assert derived == actual
        checks = {
            r["conname"]
            for r in conn.execute(
                "SELECT conname FROM pg_constraint"
                " WHERE conrelid = 'public.idempotency_keys'::regclass AND contype = 'c'"
            ).fetchall()
        }
        assert shape.checks and set(shape.checks) <= checks
        unique = conn.execute(
            "SELECT array_agg(a.attname::text ORDER BY k.o) AS cols"
            " FROM pg_index i, unnest(i.indkey) WITH ORDINALITY k(n, o)"
            " JOIN pg_attribute a ON a.attrelid = 'public.idempotency_keys'::regclass AND a.attnum = k.n"
            " WHERE i.indrelid = 'public.idempotency_keys'::regclass AND i.indnullsnotdistinct GROUP BY i.indexrelid"
        ).fetchone()
        assert unique is not None and unique["cols"] == shape.unique


def test_idems_own_table_shows_no_difference_to_the_preflight(fresh_admin_url: str) -> None:
    """Its record removed, idem's own table is refused for that alone: every column, the UNIQUE
    key and the CHECKs match what the migrations declare (a drifted shape would be listed)."""
    with connect(fresh_admin_url) as conn:
        conn.execute("DELETE FROM public._yoyo_migration WHERE migration_id = %s", (STORE_MIGRATION,))
    done = subprocess.run(
        [testdb.idem_command(), "migrate", "--database-url", fresh_admin_url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done
    assert "its shape matches idem's, but idem adopts no table it did not create" in done.stderr, done.stderr
