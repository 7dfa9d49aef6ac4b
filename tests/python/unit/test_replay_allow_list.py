"""IDEM_REPLAY_HEADERS, parsed without a database: the allow-list never extends to a credential,
refuses framing headers and non-names, and reads a comma-separated string from the environment
(what a replay then sends is in tests/python/shim/test_replay.py)."""

from __future__ import annotations

from typing import Any

import pytest

from idem_shim.config import ConfigVars, Settings
from idem_shim.replay import replay_header_names

URL = "postgresql://app@db/raptor"


@pytest.mark.parametrize(
    "name",
    [
        "Set-Cookie",
        "set-cookie",
        "Authorization",
        "WWW-Authenticate",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "Cookie",
        "X-Api-Key",
        "X-Auth-Token",
        "X-CSRF-Token",
        "X-Session-Id",
    ],
)
def test_the_allow_list_never_extends_to_a_credential(name: str) -> None:
    with pytest.raises(ValueError, match="credential"):
        Settings.from_mapping({ConfigVars.DATABASE_URL: URL, ConfigVars.REPLAY_HEADERS: [name]})


@pytest.mark.parametrize("value", [["Content-Length"], ["Transfer-Encoding"], ["bad header"], "X-Ok, Date"])
def test_the_allow_list_refuses_framing_headers_and_non_names(value: Any) -> None:
    with pytest.raises(ValueError, match="IDEM_REPLAY_HEADERS"):
        Settings.from_mapping({ConfigVars.DATABASE_URL: URL, ConfigVars.REPLAY_HEADERS: value})


def test_the_allow_list_from_the_environment_is_a_comma_separated_string() -> None:
    settings = Settings.from_mapping({ConfigVars.DATABASE_URL: URL, ConfigVars.REPLAY_HEADERS: " X-A , x-b,"})
    assert settings.replay_headers == replay_header_names(["X-A", "x-b"])
    assert settings.replay_headers[:5] == ("Location", "Content-Location", "ETag", "Link", "Content-Type")
