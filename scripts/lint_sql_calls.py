"""Two rules of scripts/lint_sql.py that read the text of PL/pgSQL bodies (no database needed).

- Calls between idem routines are exactly typed, so no overload another role plants in
  ``public`` can win the call (PostgreSQL picks a ``text`` overload for an untyped ``NULL``, an
  ``integer`` one for a bare ``5`` passed to a ``bigint`` parameter): each argument of a call to
  ``public.idem_*`` that is a literal or a plain variable must have exactly the parameter's type;
  ``NULL``, a number or a string is typed by a cast (``NULL::integer``) unless the literal's own
  type is the parameter's (a quoted string for ``text``, a whole number for ``integer``).
- No backslash in a plain quoted literal: a session with ``standard_conforming_strings = off``
  reads ``'\\s'`` as ``'s'`` when the body is parsed, so the routine would behave otherwise in
  that session; ``E'\\\\s'`` reads the same under both settings.
"""

from __future__ import annotations

import re

_CALL = re.compile(r"\bpublic\.(idem_\w+)\s*\(", re.I)
_NAMED = re.compile(r"^(\w+)\s*=>\s*(.*)$", re.S)
_STRING = re.compile(r"^'(?:[^']|'')*'$", re.S)
_NUMBER = re.compile(r"^-?\d+$")
_DECIMAL = re.compile(r"^-?\d*\.\d+$")
_IDENT = re.compile(r"^[a-z_]\w*$", re.I)
_DECLARED = re.compile(r"^\s*(\w+)\s+(?:CONSTANT\s+)?([\w.]+(?:\s+precision)?)", re.I | re.M)
#: type names as a DECLARE writes them -> as pg_catalog.format_type prints them
_ALIASES = {
    "int": "integer",
    "int4": "integer",
    "int8": "bigint",
    "int2": "smallint",
    "float8": "double precision",
    "bool": "boolean",
    "timestamptz": "timestamp with time zone",
    "varchar": "character varying",
}


def _norm(kind: str) -> str:
    kind = kind.lower().removeprefix("pg_catalog.").removeprefix("public.")
    return _ALIASES.get(kind, kind)


def _strip(body: str) -> str:
    """The body without comments and with string contents blanked (quotes kept)."""
    out, i = [], 0
    while i < len(body):
        if body.startswith("--", i):
            i = body.find("\n", i) if "\n" in body[i:] else len(body)
        elif body[i] == "'":
            j = i + 1
            while j < len(body) and not (body[j] == "'" and body[j + 1 : j + 2] != "'"):
                j += 2 if body[j : j + 2] == "''" else 1
            out.append(body[i : j + 1])
            i = j + 1
        else:
            out.append(body[i])
            i += 1
    return "".join(out)


def _arguments(text: str, start: int) -> list[str]:
    """The top-level comma-separated arguments of the call whose '(' ends at start."""
    args, depth, begin, i, quoted = [], 0, start, start, False
    while i < len(text):
        char = text[i]
        if char == "'":
            quoted = not quoted
        elif not quoted:
            if char in "([":
                depth += 1
            elif char in ")]":
                if depth == 0:
                    args.append(text[begin:i])
                    return [a.strip() for a in args if a.strip()]
                depth -= 1
            elif char == "," and depth == 0:
                args.append(text[begin:i])
                begin = i + 1
        i += 1
    return []


def untyped_calls(body: str, own_types: dict[str, str], signatures: dict[str, list[tuple[str, str]]]) -> list[str]:
    """Each argument of a call to an idem routine that an overload could win, as a sentence.

    ``own_types``: the calling routine's parameters and variables (name -> type);
    ``signatures``: each idem routine's parameters in order (name, type as format_type prints it)."""
    text = _strip(body)
    declared = {n.lower(): _norm(k) for n, k in _DECLARED.findall(text.split("BEGIN", 1)[0].split("DECLARE", 1)[-1])}
    types = {**{n.lower(): _norm(k) for n, k in own_types.items()}, **declared}
    found = []
    for call in _CALL.finditer(text):
        name = call.group(1).lower()
        params = signatures.get(name)
        if params is None:
            continue
        for position, arg in enumerate(_arguments(text, call.end())):
            named = _NAMED.match(arg)
            target = next((t for n, t in params if named and n == named.group(1).lower()), None)
            value = named.group(2).strip() if named else arg
            if target is None and not named and position < len(params):
                target = params[position][1]
            if target is None:
                continue
            got: str | None
            if value.upper() == "NULL":
                got = "an untyped NULL"
            elif _STRING.match(value):
                got = None if target == "text" else "an untyped string"
            elif _NUMBER.match(value):
                got = None if target == "integer" else "an integer literal"
            elif _DECIMAL.match(value):
                got = None if target == "numeric" else "a numeric literal"
            elif _IDENT.match(value) and value.lower() in types:
                kind = types[value.lower()]
                got = None if kind == target else f"{value} ({kind})"
            else:
                continue  # an expression, a cast or a nested call: typed by what it is
            if got:
                found.append(f"public.{name} gets {got} for its {target} parameter: cast it (::{target})")
    return found


def backslash_literals(body: str) -> list[str]:
    """Each plain quoted literal holding a backslash (E'...' strings and dollar quotes are fine)."""
    found, i = [], 0
    while i < len(body):
        if body.startswith("--", i):
            i = body.find("\n", i) if "\n" in body[i:] else len(body)
            continue
        if body[i] == "'":
            escaped = i > 0 and body[i - 1] in "eE" and not (i > 1 and (body[i - 2].isalnum() or body[i - 2] == "_"))
            j = i + 1
            while j < len(body):
                if escaped and body[j] == "\\":
                    j += 2
                    continue
                if body[j] == "'":
                    if body[j + 1 : j + 2] == "'":
                        j += 2
                        continue
                    break
                j += 1
            literal = body[i : j + 1]
            if not escaped and "\\" in literal:
                found.append(literal if len(literal) <= 60 else literal[:57] + "...'")
            i = j + 1
            continue
        if body[i] == "$":
            tag = re.match(r"\$\w*\$", body[i:])
            if tag:
                end = body.find(tag.group(0), i + len(tag.group(0)))
                i = len(body) if end < 0 else end + len(tag.group(0))
                continue
        i += 1
    return found
