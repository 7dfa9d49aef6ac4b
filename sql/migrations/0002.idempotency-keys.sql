-- The idempotency store: the table of contract §2, its result type and
-- event log. Functions live in sql/functions/ and are re-applied after every migrate.
-- depends: 0001.host-tables

CREATE TABLE public.idempotency_keys (
    id              BIGSERIAL      PRIMARY KEY,
    -- Canonical form only (lower-case, hyphenated), so ABC… and abc… are one key.
    idem_key        TEXT           NOT NULL
                    CONSTRAINT ck_idem_key_canonical
                    CHECK (idem_key ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'),
    -- Its type and its foreign key to the host's users table: migration 0017 (an earlier 0002
    -- made the key to public.users here; 0017 keeps it).
    scope_user_id   INTEGER,
    scope_endpoint  TEXT           NOT NULL
                    CONSTRAINT ck_idem_endpoint_not_empty CHECK (scope_endpoint <> ''),
    request_hash    TEXT           NOT NULL,
    response_code   SMALLINT,
    response_body   JSONB,
    status          TEXT           NOT NULL DEFAULT 'in_flight'
                                   CHECK (status IN ('in_flight','completed','failed')),
    created_at      TIMESTAMPTZ    NOT NULL DEFAULT NOW(),
    locked_at       TIMESTAMPTZ    NOT NULL DEFAULT NOW(),
    expires_at      TIMESTAMPTZ    NOT NULL,
    -- NULLS NOT DISTINCT: service calls (no user) dedupe too (contract §2).
    CONSTRAINT uq_idem_key_user_endpoint
        UNIQUE NULLS NOT DISTINCT (idem_key, scope_user_id, scope_endpoint),
    -- GDPR: nothing is kept longer than 7 days, whatever a caller asks for. In hours, not
    -- days: timestamptz + '7 days' follows the session's TimeZone (167 or 169 hours across
    -- a DST change), so an UPDATE or a restore in another zone could fail or over-retain.
    CONSTRAINT ck_idem_retention_cap
        CHECK (expires_at > created_at AND expires_at <= created_at + interval '168 hours')
);

COMMENT ON TABLE public.idempotency_keys IS
    'ADR-0138 idempotency store: one row per (idem_key, scope_user_id, scope_endpoint). '
    'Written only through the idem_* functions.';

-- Cleanup of finished rows (contract §2's index).
CREATE INDEX idx_idem_keys_expires
    ON public.idempotency_keys (expires_at)
    WHERE status IN ('completed','failed');

-- GDPR erasure and export by user (contract §2's index).
CREATE INDEX idx_idem_keys_user
    ON public.idempotency_keys (scope_user_id)
    WHERE scope_user_id IS NOT NULL;

-- In-flight holders are few: this small index finds stale ones and expired orphans
-- without scanning the table (the expiry index above only covers finished rows).
CREATE INDEX idx_idem_keys_in_flight
    ON public.idempotency_keys (locked_at)
    WHERE status = 'in_flight';

-- What idem_claim returns; callers branch on `outcome` (a closed set, see the function).
CREATE TYPE public.idem_claim_result AS (
    outcome         text,
    key_id          bigint,
    request_hash    text,
    response_code   smallint,
    response_body   jsonb,
    retry_after_ms  integer
);

-- Append-only log of what a DBA is alerted about: stale heals, erasures, cleanups.
-- Bounded: idem_cleanup trims it to the same 7-day horizon as the store.
CREATE TABLE public.idempotency_events (
    id              BIGSERIAL      PRIMARY KEY,
    occurred_at     TIMESTAMPTZ    NOT NULL DEFAULT clock_timestamp(),
    event           TEXT           NOT NULL
                    CHECK (event IN ('stale_heal','lost_claim','erasure')),
    key_id          BIGINT,
    scope_user_id   INTEGER,
    scope_endpoint  TEXT,
    detail          JSONB          NOT NULL DEFAULT '{}'::jsonb
);

CREATE INDEX idx_idem_events_occurred ON public.idempotency_events (occurred_at);

-- Least privilege: nobody reads or writes these tables directly; the app role only
-- executes the functions (granted in sql/functions/990_privileges.sql).
REVOKE ALL ON public.idempotency_keys, public.idempotency_events FROM PUBLIC;
