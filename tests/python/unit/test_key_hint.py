"""The key's hint in log lines (logs.key_hint) shows a bounded, small share of any key: at most 4
characters and at most a quarter of it (issue 39's hardening note: an 8-character hint was half
of a 16-character opaque key), and a prefix, so an operator still finds a client's key in the
logs by its first characters."""

from __future__ import annotations

import pytest

from idem_shim.logs import key_hint


@pytest.mark.parametrize("length", [1, 3, 4, 7, 8, 15, 16, 17, 36, 255])
def test_the_hint_is_a_short_prefix_of_at_most_a_quarter_of_the_key(length: int) -> None:
    key = "".join(chr(0x21 + (i * 7) % 90) for i in range(length))
    hint = key_hint(key)
    assert key.startswith(hint)
    assert len(hint) <= 4 and len(hint) * 4 <= length, f"{len(hint)} characters of a {length}-character key"


def test_a_uuid_and_a_sixteen_character_key_show_four_characters() -> None:
    assert key_hint("1f0c2a9b-3c4d-4e5f-8a9b-0c1d2e3f4a5b") == "1f0c"
    assert key_hint("order-2026-12-01") == "orde"
