"""Every statement of ``idem_shim.queries`` names each function, type and operator it uses, so the
app's session path (which the app's role sets for itself) resolves none of them: a domain
``public.text`` on a path of ``public, pg_catalog`` saw every request's key, body, token and the
response key (tests/python/shim/test_sec_shim_types.py shows the attack; this keeps the class shut
for statements added later)."""

from __future__ import annotations

import re

import pytest

from idem_shim import queries

#: Type names the grammar maps to pg_catalog's types itself (keywords): no path reaches them.
KEYWORD_TYPES = {"integer", "int", "bigint", "smallint", "boolean", "interval", "numeric", "real"}
#: Words that take parentheses and are no function (SQL syntax).
#: Boolean operators are keywords too: ``AND (`` is a grouping, not a call.
SYNTAX = {
    "select",
    "any",
    "all",
    "operator",
    "in",
    "exists",
    "values",
    "coalesce",
    "nullif",
    "greatest",
    "least",
    "and",
    "or",
    "not",
}

_CALL = re.compile(r"(?<![.\w\"])([A-Za-z_][A-Za-z0-9_]*)\s*\(")
_CAST = re.compile(r"::\s*([A-Za-z_][A-Za-z0-9_]*)\b(?!\s*\.)")
_BARE_OPERATOR = re.compile(r"(?<![<>=!])(=|<>|<=|>=|<|>)(?![=>])")


def _statements() -> list[tuple[str, str]]:
    found = [(name, value) for name, value in vars(queries).items() if name.isupper() and isinstance(value, str)]
    found += [(f"CLEANUP_ARGUMENTS[{k}]", v) for k, v in queries.CLEANUP_ARGUMENTS.items()]
    return found


def _strip(statement: str) -> str:
    """The statement without its string literals and the OPERATOR(schema.op) spellings."""
    text = re.sub(r"'(?:[^']|'')*'", "''", statement)
    return re.sub(r"OPERATOR\(pg_catalog\.[^)]+\)", "OPERATOR()", text)


@pytest.mark.parametrize(("name", "statement"), _statements(), ids=[n for n, _ in _statements()])
def test_every_name_in_a_shim_statement_is_qualified(name: str, statement: str) -> None:
    text = _strip(statement)
    calls = {m.group(1) for m in _CALL.finditer(text)} - {w for w in SYNTAX} - {w.upper() for w in SYNTAX}
    calls = {c for c in calls if c.lower() not in SYNTAX}
    casts = {m.group(1) for m in _CAST.finditer(text) if m.group(1).lower() not in KEYWORD_TYPES}
    casts.discard("pg_catalog")
    operators = set(_BARE_OPERATOR.findall(re.sub(r"=>", " ", text)))
    assert (calls, casts, operators) == (set(), set(), set()), f"{name} resolves through the session's path"
