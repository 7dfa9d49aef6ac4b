"""Settings from app.config, then the environment, then the defaults, and the pure helpers:
key parsing and what a body hashes as. No database needed.
"""

from __future__ import annotations

import json
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from idem_shim.config import (
    DEFAULTS,
    MAX_SCOPE_LENGTH,
    MAX_TTL_HOURS,
    MAX_WAIT_MS,
    MIN_STALE_AFTER_SECONDS,
    PREFIX,
    ConfigVars,
    Settings,
    reference_table,
    validate_scope,
)
from idem_shim.errors import ConfigError
from idem_shim.fingerprint import RAW_BODY_PREFIX, body_json, parse_key, request_json
from idem_shim.health_gauges import OTHER_SCOPE

URL = "postgresql://app@db/raptor"


def test_defaults() -> None:
    settings = Settings.from_mapping({ConfigVars.DATABASE_URL: URL})
    assert settings.max_body_bytes == 1024 * 1024 == DEFAULTS[ConfigVars.MAX_BODY_BYTES]
    assert settings.stale_after_seconds == 30 and settings.wait_ms == 0
    assert settings.prepare_threshold == 5 and settings.statement_timeout_ms == 5000
    assert settings.check_schema is True and settings.response_key is None


def test_strings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", URL)
    settings = Settings.from_mapping(
        {
            ConfigVars.PREPARE_THRESHOLD: "None",
            ConfigVars.STATEMENT_TIMEOUT_MS: "none",
            ConfigVars.CHECK_SCHEMA: "0",
            ConfigVars.STALE_AFTER_SECONDS: "2.5",
            ConfigVars.POOL_MAX_SIZE: "4",
        }
    )
    assert settings.database_url == URL  # fell back to DATABASE_URL
    assert settings.prepare_threshold is None and settings.statement_timeout_ms is None
    assert settings.check_schema is False and settings.stale_after_seconds == 2.5
    assert settings.pool_max_size == 4


def test_every_key_is_read_from_the_config_then_the_environment_then_its_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each IDEM_* key of Settings, with no config, takes the environment's value (a string,
    parsed as the config's would be); the config wins over it; an empty variable is unset."""
    env = {
        ConfigVars.DATABASE_URL: URL,
        ConfigVars.WAIT_MS: "2000",
        ConfigVars.POOL_TIMEOUT: "0.5",
        ConfigVars.STORE_PROBE_INTERVAL: "0.25",
        ConfigVars.CHECK_SCHEMA: "off",
        ConfigVars.PREPARE_THRESHOLD: "none",
        ConfigVars.REPLAY_HEADERS: "X-Request-Id, X-Trace",
        ConfigVars.ERROR_FORMAT: "Problem+JSON",
        ConfigVars.RESPONSE_KEY: "k3y-" + "0123456789abcdefghijklmnopqrstuvwxyz",
    }
    settings = Settings.from_mapping({}, env)
    assert settings.database_url == URL and settings.wait_ms == 2000 and settings.pool_timeout == 0.5
    assert settings.store_probe_interval == 0.25 and settings.check_schema is False
    assert settings.prepare_threshold is None and settings.replay_headers[-2:] == ("X-Request-Id", "X-Trace")
    assert settings.error_format == "problem+json" and settings.response_key == env[ConfigVars.RESPONSE_KEY]
    assert env[ConfigVars.RESPONSE_KEY] not in repr(settings), "a secret never shows in a repr"

    config = {ConfigVars.WAIT_MS: 100, ConfigVars.CHECK_SCHEMA: True}
    assert Settings.from_mapping(config, env).wait_ms == 100  # the app's config first
    assert Settings.from_mapping(config, env).check_schema is True
    assert Settings.from_mapping({}, {**env, ConfigVars.WAIT_MS: "  "}).wait_ms == 0  # blank: the default
    monkeypatch.setenv(ConfigVars.WAIT_MS, "1500")  # os.environ when no mapping is given
    assert Settings.from_mapping({ConfigVars.DATABASE_URL: URL}).wait_ms == 1500
    # every declared key is read, none by hand: each one's name in the environment is honoured
    for spec in fields(Settings):
        name = PREFIX + spec.name.upper()
        assert name in env or spec.metadata["default"] == DEFAULTS[name]


def test_a_bad_value_from_the_environment_says_where_it_came_from_and_never_shows_a_secret() -> None:
    with pytest.raises(ValueError, match=r"IDEM_WAIT_MS \(from the environment\): .*'soon'"):
        Settings.from_mapping({}, {"DATABASE_URL": URL, ConfigVars.WAIT_MS: "soon"})
    secret = "short-and-secret"
    with pytest.raises(ValueError) as refused:
        Settings.from_mapping({}, {"DATABASE_URL": URL, ConfigVars.RESPONSE_KEY: secret})
    assert ConfigVars.RESPONSE_KEY in str(refused.value) and secret not in str(refused.value)


@pytest.mark.parametrize(
    "config",
    [
        {},
        {ConfigVars.DATABASE_URL: URL, ConfigVars.POOL_MIN_SIZE: 5, ConfigVars.POOL_MAX_SIZE: 2},
        {ConfigVars.DATABASE_URL: URL, ConfigVars.WAIT_MS: 6000},  # would be cut by the statement timeout
        {ConfigVars.DATABASE_URL: URL, ConfigVars.RESPONSE_KEY: "short"},
        {ConfigVars.DATABASE_URL: URL, ConfigVars.RESPONSE_KEY: "a" * 40},  # long but not random
    ],
)
def test_bad_settings_are_refused(config: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    with pytest.raises(ValueError):
        Settings.from_mapping(config)


@pytest.mark.parametrize(
    ("header", "key"),
    [
        ("8E03978E-40D5-43E8-BC93-6894A57F9324", "8e03978e-40d5-43e8-bc93-6894a57f9324"),
        ('"8e03978e-40d5-43e8-bc93-6894a57f9324"', "8e03978e-40d5-43e8-bc93-6894a57f9324"),
        ("  8e03978e-40d5-43e8-bc93-6894a57f9324 ", "8e03978e-40d5-43e8-bc93-6894a57f9324"),
        ("8e03978e40d543e8bc936894a57f9324", None),
        ("urn:uuid:8e03978e-40d5-43e8-bc93-6894a57f9324", None),
        ('""', None),
        ("8e03978e-40d5-43e8-bc93-6894a57f932", None),
        ("00000000-0000-0000-0000-000000000000", None),  # the nil UUID: a placeholder, not a key
        ('"00000000-0000-0000-0000-000000000000"', None),
        # Only RFC 9110's OWS (space, tab) around the field: gunicorn hands a Latin-1 value over
        # as sent, and str.strip() would make a key of one ending in NEL, NBSP or a control character.
        ("\t8e03978e-40d5-43e8-bc93-6894a57f9324\t", "8e03978e-40d5-43e8-bc93-6894a57f9324"),
        ("8e03978e-40d5-43e8-bc93-6894a57f9324\x85", None),
        ("\xa08e03978e-40d5-43e8-bc93-6894a57f9324", None),
        ("8e03978e-40d5-43e8-bc93-6894a57f9324\x1f", None),
        ("8e03978e-40d5-43e8-bc93-6894a57f9324\x0b", None),
    ],
)
def test_parse_key(header: str, key: str | None) -> None:
    assert parse_key(header) == key


def test_what_bodies_hash_as() -> None:
    assert body_json(b"") is None
    assert body_json(b'{"b": 1.10, "a": [1]}') == '{"b": 1.10, "a": [1]}'  # passed through, exact digits
    raw = json.loads(body_json(b"a=1&b=2") or "")
    assert raw.startswith(RAW_BODY_PREFIX) and raw != json.loads(body_json(b"a=1&b=3") or "")
    for refused in (b'{"x": NaN}', b'{"x": "\\u0000"}', b'{"x": "\\ud800"}', b"\xff\xfe", b"   "):
        assert json.loads(body_json(refused) or "").startswith(RAW_BODY_PREFIX), refused
    json_post: dict[str, Any] = {"method": None, "content_type": "application/json"}
    wrapped = json.loads(request_json(b'{"a": 1}', {"order_id": 7}, {"dry": ["1"]}, **json_post) or "")
    assert wrapped == {"body": {"a": 1}, "path": {"order_id": 7}, "query": {"dry": ["1"]}}
    assert json.loads(request_json(b"", {"order_id": 7}, {}, method=None, content_type=None) or "") == {
        "body": None,
        "path": {"order_id": 7},
        "query": {},
    }


# -- one declaration per key ----------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[3]


def test_every_key_is_declared_once_and_the_derived_names_agree() -> None:
    names = [PREFIX + spec.name.upper() for spec in fields(Settings)]
    assert list(DEFAULTS) == names and len(set(names)) == len(names) == 32
    assert ConfigVars.WAIT_MS == "IDEM_WAIT_MS" and ConfigVars.DATABASE_URL == "IDEM_DATABASE_URL"
    defaults = Settings.from_mapping({ConfigVars.DATABASE_URL: URL})
    assert [getattr(defaults, spec.name) for spec in fields(Settings)][3:] == [
        spec.default for spec in fields(Settings)
    ][3:]  # the dataclass defaults are the parsed raw ones (the three URLs resolve to the app's)
    assert (defaults.database_url, defaults.admin_database_url, defaults.dsr_database_url) == (URL, URL, URL)


def test_the_admin_url_is_config_then_environment_then_the_apps(monkeypatch: pytest.MonkeyPatch) -> None:
    """IDEM_ADMIN_DATABASE_URL (the CLI's admin verbs, a role in idem_admin): the app's config,
    else the environment, else the app's own URL; never the other way round."""
    dba, env_dba = "postgresql://dba@db/raptor", "postgresql://dba_env@db/raptor"
    monkeypatch.delenv(ConfigVars.ADMIN_DATABASE_URL, raising=False)
    assert Settings.from_mapping({ConfigVars.DATABASE_URL: URL}).admin_database_url == URL
    monkeypatch.setenv(ConfigVars.ADMIN_DATABASE_URL, env_dba)
    assert Settings.from_mapping({ConfigVars.DATABASE_URL: URL}).admin_database_url == env_dba
    config = {ConfigVars.DATABASE_URL: URL, ConfigVars.ADMIN_DATABASE_URL: dba}
    settings = Settings.from_mapping(config)
    assert (settings.database_url, settings.admin_database_url) == (URL, dba)
    monkeypatch.setenv(ConfigVars.ADMIN_DATABASE_URL, "  ")  # blank: unset
    assert Settings.from_mapping({ConfigVars.DATABASE_URL: URL}).admin_database_url == URL


def test_the_data_subject_url_is_config_then_environment_then_the_admin_verbs(monkeypatch: pytest.MonkeyPatch) -> None:
    """IDEM_DSR_DATABASE_URL (erase-user, export-user: a role in idem_dsr): the app's config, else
    the environment, else the admin verbs' URL (idem_admin holds both functions too)."""
    dba, gdpr, env_gdpr = "postgresql://dba@db/raptor", "postgresql://gdpr@db/raptor", "postgresql://gdpr_env@db/raptor"
    monkeypatch.delenv(ConfigVars.ADMIN_DATABASE_URL, raising=False)
    monkeypatch.delenv(ConfigVars.DSR_DATABASE_URL, raising=False)
    assert Settings.from_mapping({ConfigVars.DATABASE_URL: URL}).dsr_database_url == URL
    config = {ConfigVars.DATABASE_URL: URL, ConfigVars.ADMIN_DATABASE_URL: dba}
    assert Settings.from_mapping(config).dsr_database_url == dba
    monkeypatch.setenv(ConfigVars.DSR_DATABASE_URL, env_gdpr)
    assert Settings.from_mapping(config).dsr_database_url == env_gdpr
    assert Settings.from_mapping({**config, ConfigVars.DSR_DATABASE_URL: gdpr}).dsr_database_url == gdpr


def test_the_docs_table_is_the_declarations() -> None:
    assert reference_table() in (ROOT / "docs" / "shim.md").read_text(encoding="utf-8")


def test_the_sql_bounds_the_shim_checks_early_are_the_sql_apis() -> None:
    """MAX_TTL_HOURS and MAX_WAIT_MS fail a route at import (and IDEM_WAIT_MS at init_app) instead
    of every request; they must be idem_claim's own bounds, read here from its guard."""
    claim = (ROOT / "sql" / "functions" / "010_idem_claim.sql").read_text(encoding="utf-8")
    ttl = re.search(r"p_ttl > interval '(\d+) days'", claim)
    wait = re.search(r"p_wait_ms > (\d+) THEN", claim)
    assert ttl is not None and wait is not None
    assert (int(ttl.group(1)) * 24, int(wait.group(1))) == (MAX_TTL_HOURS, MAX_WAIT_MS)
    stale = re.search(r"EXTRACT\(epoch FROM p_stale_after\) < (\d+) AND NOT public.idem_caller_is", claim)
    assert stale is not None and int(stale.group(1)) == MIN_STALE_AFTER_SECONDS


def test_the_scope_bound_is_the_sql_apis() -> None:
    """Issue 39 F5: a scope the shim accepts is one idem_claim stores (at most MAX_SCOPE_LENGTH
    characters), and each routine that takes p_endpoint tests the one rule idem_refuse_endpoint
    states, to the character."""
    refusal = (ROOT / "sql" / "functions" / "016_idem_refuse_endpoint.sql").read_text(encoding="utf-8")
    rule = re.search(r"--   IF (pg_catalog\.length\(p_endpoint\) > (\d+)\n--\s+OR p_endpoint ~ E'[^']+')", refusal)
    assert rule is not None and int(rule.group(2)) == MAX_SCOPE_LENGTH
    inline = " ".join(rule.group(1).replace("--", "").split())
    for routine in ("010_idem_claim.sql", "015_idem_downstream_key.sql", "130_idem_record_lost_claim.sql"):
        body = " ".join((ROOT / "sql" / "functions" / routine).read_text(encoding="utf-8").split())
        assert inline in body, routine


@pytest.mark.parametrize(
    "scope", ["x" * (MAX_SCOPE_LENGTH + 1), "orders\x85place", "orders\u2028place", "orders\u202eplace", OTHER_SCOPE]
)
def test_a_scope_idem_claim_would_refuse_or_the_gauges_other_is_refused(scope: str) -> None:
    with pytest.raises(ValueError):
        validate_scope(scope)
    with pytest.raises(ConfigError, match="IDEM_GAUGE_SCOPES"):
        Settings.from_mapping({ConfigVars.DATABASE_URL: URL, "IDEM_GAUGE_SCOPES": ["fills.apply", scope]})


def test_gauge_scopes_read_a_list_or_a_comma_separated_string() -> None:
    assert Settings.from_mapping(
        {ConfigVars.DATABASE_URL: URL}, {"IDEM_GAUGE_SCOPES": "fills.apply, a.b"}
    ).gauge_scopes == (
        "fills.apply",
        "a.b",
    )
    assert validate_scope("x" * MAX_SCOPE_LENGTH) == "x" * MAX_SCOPE_LENGTH
