"""make demo's client takes the user's bearer token from DEMO_TOKEN: a generated token may begin
with "-" (secrets.token_urlsafe: one in 64), which its argument parser took for an option, and a
process's arguments are anyone's to read."""

from __future__ import annotations

import pytest

from examples.raptor import demo_client

ARGS = ["--base", "http://127.0.0.1:8000", "--admin-url", "postgresql://x/y", "--user-id", "7"]


def test_a_token_that_begins_with_a_dash_is_the_token() -> None:
    args = demo_client.parse(ARGS, {"DEMO_TOKEN": "-Zq3_tokenthatlookslikeanoption"})
    assert args.token == "-Zq3_tokenthatlookslikeanoption"
    assert args.user_id == 7


def test_no_token_is_a_usage_error_naming_the_variable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        demo_client.parse(ARGS, {})
    assert exit_.value.code == 2
    assert "DEMO_TOKEN" in capsys.readouterr().err


def test_the_token_is_no_argument() -> None:
    with pytest.raises(SystemExit):
        demo_client.parse([*ARGS, "--token", "abc"], {"DEMO_TOKEN": "abc"})
