"""errors.describe makes every one-line error the CLIs print and the logs write: a name in the
server's message is its maker's text (the database owner's table, a session's application_name),
and the server's own screens ([[:cntrl:]]) miss C1 where the database's LC_CTYPE is C and the
Unicode line separators everywhere. None of them reaches the DBA's terminal."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from idem_shim.errors import CONTROL, describe


class ServerError(Exception):
    def __init__(self, primary: str) -> None:
        super().__init__(primary)
        self.diag = SimpleNamespace(message_primary=primary)


@pytest.mark.parametrize(
    "planted",
    ["\x1b]0;owned\x07", "\x9b31m", "\x85", "\u2028", "\u2029", "\x00", "\x7f", "\x0b", "\x1c"],
)
def test_a_control_character_in_a_message_is_shown_as_a_question_mark(planted: str) -> None:
    line = describe(ServerError(f"public.users{planted}x is not distributed"))
    assert line.startswith("public.users?") and line.endswith("x is not distributed"), repr(line)
    assert not CONTROL.search(line), repr(line)


def test_the_first_line_is_kept_and_spaces_are_one() -> None:
    """A planted NEL or U+2028 ends no line: the rest of the refusal is not hidden behind it."""
    assert describe(ServerError("ERROR:  a\t b\n  second line")) == "a b"
    assert describe(ServerError("ERROR:  a\r\nb")) == "a"
    assert describe(Exception("")) == "Exception"
