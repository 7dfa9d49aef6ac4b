-- idem_claim
-- The unique constraint decides every race; no lock is held after the call returns. A heal
-- deletes a stale row only if it is still the very row that was read (same id, status and
-- lease), so concurrent detectors and a late holder can never both win.
CREATE OR REPLACE FUNCTION public.idem_claim(
    p_key          text,
    p_user_id      public.idem_user_id,
    p_endpoint     text,
    p_request      jsonb,
    p_ttl          interval    DEFAULT '24 hours',
    p_stale_after  interval    DEFAULT '30 seconds',
    p_wait_ms      integer     DEFAULT 0,
    p_on_stale     text        DEFAULT 'heal',
    p_now          timestamptz DEFAULT NULL,
    p_response_key           text DEFAULT NULL,
    p_response_key_fallback  text DEFAULT NULL,
    p_key_format             text DEFAULT 'uuid'
)
RETURNS public.idem_claim_result
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- first: a caller's collation would reach every text parameter and variable (idem_refuse_collation)
    v_uncollated  constant boolean := (pg_catalog.pg_collation_for(p_key) COLLATE pg_catalog."C") OPERATOR(pg_catalog.=) '"default"'
                                      OR public.idem_refuse_collation('idem_claim', pg_catalog.pg_collation_for(p_key));
    v_key        text := public.idem_canonical_key(p_key, p_key_format);
    -- The row's scope: p_user_id on one node; on a distributed store never NULL (a service call
    -- is scoped to the reserved user 0) and the shard every statement below names.
    v_scope      public.idem_user_id := public.idem_scope(p_user_id);
    v_started    timestamptz := pg_catalog.clock_timestamp();
    v_hash       text;
    v_ttl        interval;
    v_now        timestamptz;
    v_row        public.idempotency_keys%ROWTYPE;
    v_id         bigint;
    v_attempt    integer;
    v_token      text;
    v_lease_ms   bigint;
    v_held_ms    integer;
    v_retries    integer := 0;
    v_sleep_ms   integer := 5;
BEGIN
    -- GUARD: arguments (misuse raises; outcomes are returned)
    IF p_endpoint IS NULL OR p_endpoint = '' THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = 'idem_claim: p_endpoint must be a non-empty route name';
    END IF;
    -- GUARD: a name the shim would never send (too long for a label, a control character):
    -- refused before anything is written (idem_refuse_endpoint says the rule)
    IF pg_catalog.length(p_endpoint) > 200
       OR p_endpoint ~ E'[\\x01-\\x1f\\x7f-\\x9f\\u2028\\u2029\\u202a-\\u202e\\u2066-\\u2069]' THEN
        PERFORM public.idem_refuse_endpoint('idem_claim', p_endpoint);
    END IF;
    -- Both forms of the interval: compared, a month is 30 days; as elapsed time (what the
    -- row's expires_at gets), a year is 365.25 days, so '12 mons -353 days' passes the first
    -- and is 12.25 days in the second (found by test_prop_sql.py).
    IF p_ttl IS NULL OR p_ttl <= interval '0' OR p_ttl > interval '7 days'
       OR EXTRACT(epoch FROM p_ttl) <= 0 OR EXTRACT(epoch FROM p_ttl) > 604800 THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = pg_catalog.format('idem_claim: p_ttl must be positive and at most 7 days (got %s)', COALESCE(p_ttl::text, 'NULL')),
            HINT = 'retention is capped at 7 days (contract §2)';
    END IF;
    IF p_stale_after IS NULL OR p_stale_after <= interval '0' OR EXTRACT(epoch FROM p_stale_after) <= 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = 'idem_claim: p_stale_after must be a positive interval';
    END IF;
    -- A window below a second would let any member of idem_app heal a live key at will, and fill
    -- idem_health with made-up stale heals and lost claims: that short a lease is for the owner
    -- (the tests) and a DBA. The common window (30 s) pays no check.
    IF EXTRACT(epoch FROM p_stale_after) < 1 AND NOT public.idem_caller_is('admin') THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = pg_catalog.format('idem_claim: p_stale_after must be at least 1 second (got %s)', p_stale_after),
            HINT = 'only the functions'' owner and members of idem_admin may pass a shorter stale window';
    END IF;
    IF p_wait_ms IS NULL OR p_wait_ms < 0 OR p_wait_ms > 60000 THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = pg_catalog.format('idem_claim: p_wait_ms must be between 0 and 60000 (got %s)', COALESCE(p_wait_ms::text, 'NULL'));
    END IF;
    IF p_on_stale IS NULL OR p_on_stale NOT IN ('heal', 'quarantine') THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = pg_catalog.format('idem_claim: p_on_stale must be ''heal'' or ''quarantine'' (got %L)', p_on_stale);
    END IF;
    -- A clock moved by the caller would store rows the retention cap never removes, or take
    -- live leases for stale: only the owner (the tests, a DBA's experiment) may move it.
    IF p_now IS NOT NULL AND NOT public.idem_caller_is('owner') THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = 'idem_claim: p_now is for tests: only the functions'' owner may pass it',
            HINT = 'leave p_now out: the claim uses the transaction''s now()';
    END IF;

    -- jsonb's text form is canonical: key order and white space do not change the hash.
    v_hash := pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(
        COALESCE(p_request, 'null'::jsonb)::text, 'UTF8')), 'hex');
    -- The TTL as elapsed time: '7 days' added to a timestamptz would follow the session's
    -- TimeZone across a DST change and could overshoot the 168-hour retention CHECK.
    v_ttl := EXTRACT(epoch FROM p_ttl) * interval '1 second';

    -- The common case (a new key) goes straight through: INSERT, then RETURN. Everything
    -- below the first GUARD runs only when the key already has a row.
    LOOP
        v_now := COALESCE(p_now, pg_catalog.now()) + (pg_catalog.clock_timestamp() - v_started);

        INSERT INTO public.idempotency_keys AS k
            (id, idem_key, scope_user_id, scope_endpoint, request_hash, status,
             created_at, locked_at, expires_at)
        VALUES (public.idem_new_key_id(v_scope), v_key, v_scope, p_endpoint, v_hash, 'in_flight',
                v_now, v_now, v_now + v_ttl)
        ON CONFLICT ON CONSTRAINT uq_idem_key_user_endpoint DO NOTHING
        RETURNING k.id INTO v_id;

        -- GUARD: the first request for this key claims it
        IF v_id IS NOT NULL THEN
            -- Which execution this is: 1 + the heals of this (key, scope, endpoint) before it. The
            -- heal deleted the row, its event remembers; the probe reads a partial index that only
            -- heals write to, so a key never healed finds an empty range. A statement of its own:
            -- Citus plans no subquery inside an INSERT. The stored scope (v_scope), as the event's.
            SELECT 1 + pg_catalog.count(*)::integer INTO v_attempt
              FROM public.idempotency_events e
             WHERE e.event = 'stale_heal' AND e.scope_endpoint = p_endpoint
               AND (e.detail ->> 'idem_key') = v_key AND e.key_id < v_id
               AND (e.scope_user_id = v_scope OR (v_scope IS NULL AND e.scope_user_id IS NULL));
            -- idem_claim_token's query, with its formula inlined: a statement of the function's
            -- own keeps its plan across calls, where a call of idem_claim_token plans it anew.
            SELECT public.idem_token_hash(s.secret, v_id, v_now) INTO v_token FROM public.idem_secret s;
            RETURN ROW('claimed', v_id, v_hash, NULL, NULL, NULL, NULL, v_token, v_attempt, NULL)::public.idem_claim_result;
        END IF;

        -- Two branches so both use the unique index (IS NOT DISTINCT FROM would not).
        IF v_scope IS NULL THEN
            SELECT * INTO v_row FROM public.idempotency_keys k
             WHERE k.idem_key = v_key AND k.scope_user_id IS NULL AND k.scope_endpoint = p_endpoint;
        ELSE
            SELECT * INTO v_row FROM public.idempotency_keys k
             WHERE k.idem_key = v_key AND k.scope_user_id = v_scope AND k.scope_endpoint = p_endpoint;
        END IF;

        -- Every path that loops again does so because a concurrent call changed the row;
        -- a bound turns a pathological storm into a clear error instead of a spin.
        v_retries := v_retries + 1;
        IF v_retries > 50 THEN
            RAISE EXCEPTION USING ERRCODE = 'IDM02',
                MESSAGE = 'idem_claim: the key kept changing under contention; retry the request';
        END IF;

        -- GUARD: the holder vanished between INSERT and SELECT (healed, erased, cleaned up)
        CONTINUE WHEN NOT FOUND;

        -- GUARD: an expired key is absent at once, before cleanup gets to it
        IF v_row.expires_at <= v_now THEN
            DELETE FROM public.idempotency_keys k
             WHERE k.id = v_row.id AND k.expires_at <= v_now AND (v_scope IS NULL OR k.scope_user_id = v_scope);
            CONTINUE;
        END IF;

        -- GUARD: same key, different body (checked before status)
        IF v_row.request_hash <> v_hash THEN
            RETURN ROW('mismatch', v_row.id, v_hash, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::public.idem_claim_result;
        END IF;

        IF v_row.status = 'completed' THEN
            -- GUARD: completed without a stored body (PII rule): not replayable, run again
            IF v_row.response_body IS NULL THEN
                DELETE FROM public.idempotency_keys k
                 WHERE k.id = v_row.id AND k.status = 'completed' AND k.response_body IS NULL
                   AND (v_scope IS NULL OR k.scope_user_id = v_scope);
                CONTINUE;
            END IF;
            -- A replay is not a new state change: one audit row tagged as such, no business row.
            INSERT INTO public.audit_log (user_id, action, context)
            VALUES (v_scope, 'idempotency_replay', pg_catalog.jsonb_build_object(
                'key_id', v_row.id,
                'scope_endpoint', p_endpoint,
                'request_hash', v_row.request_hash,
                'response_code', v_row.response_code));
            -- An encrypted body opens with the caller's key (or fallback), else IDM03; its
            -- headers were encrypted with it. Rows completed before migration 0006 have no headers.
            RETURN ROW('replay', v_row.id, v_hash, v_row.response_code,
                       public.idem_decrypt_response(v_row.response_body, p_response_key,
                                                    p_response_key_fallback),
                       NULL,
                       CASE WHEN v_row.response_headers IS NULL THEN NULL
                            ELSE public.idem_decrypt_response(v_row.response_headers, p_response_key,
                                                              p_response_key_fallback) END,
                       NULL, NULL, NULL)::public.idem_claim_result;
        END IF;

        IF v_row.status = 'failed' THEN
            RETURN ROW('previous_failed', v_row.id, v_hash, v_row.response_code, NULL, NULL, NULL, NULL, NULL, NULL)::public.idem_claim_result;
        END IF;

        -- in_flight: how long is left on the holder's lease?
        -- In elapsed seconds, like the TTL: locked_at + a huge p_stale_after would overflow
        -- timestamptz (22008; found by test_prop_sql.py).
        v_lease_ms := pg_catalog.ceil((EXTRACT(epoch FROM (v_row.locked_at - v_now))
                                       + EXTRACT(epoch FROM p_stale_after)) * 1000)::bigint;
        -- and how long it has held the key (its claim, not its last heartbeat): what the shim
        -- weighs against the route's usual duration to say when a retry will likely find it done.
        -- Under 7 days (the row is not expired), so it fits an integer; never negative.
        v_held_ms := GREATEST(0, pg_catalog.floor(EXTRACT(epoch FROM (v_now - v_row.created_at)) * 1000))::integer;

        IF v_lease_ms > 0 THEN
            -- GUARD: a live holder. Poll (no session lock, no LISTEN: PgBouncer-safe).
            IF pg_catalog.clock_timestamp() < v_started + p_wait_ms * interval '1 millisecond' THEN
                PERFORM pg_catalog.pg_sleep(LEAST(v_sleep_ms, EXTRACT(epoch FROM (
                    v_started + p_wait_ms * interval '1 millisecond' - pg_catalog.clock_timestamp())) * 1000) / 1000.0);
                v_sleep_ms := LEAST(v_sleep_ms * 2, 100);
                v_retries := 0;  -- waiting is not contention
                CONTINUE;
            END IF;
            RETURN ROW('in_flight', v_row.id, v_hash, NULL, NULL,
                       LEAST(5000, v_lease_ms)::integer, NULL, NULL, NULL, v_held_ms)::public.idem_claim_result;
        END IF;

        -- GUARD: stale holder kept, for endpoints whose side effects leave the database
        IF p_on_stale = 'quarantine' THEN
            RETURN ROW('in_flight', v_row.id, v_hash, NULL, NULL, GREATEST(1, LEAST(5000,
                pg_catalog.ceil(EXTRACT(epoch FROM (v_row.expires_at - v_now)) * 1000)))::integer,
                NULL, NULL, NULL, v_held_ms)::public.idem_claim_result;
        END IF;

        -- Stale holder (its worker died): free the key, only if nobody touched the row since.
        DELETE FROM public.idempotency_keys k
         WHERE k.id = v_row.id AND k.status = 'in_flight' AND k.locked_at = v_row.locked_at
           AND (v_scope IS NULL OR k.scope_user_id = v_scope);
        CONTINUE WHEN NOT FOUND;  -- another detector healed it, or the holder finished/renewed

        INSERT INTO public.idempotency_events (event, key_id, scope_user_id, scope_endpoint, detail)
        VALUES ('stale_heal', v_row.id, v_row.scope_user_id, v_row.scope_endpoint,
                pg_catalog.jsonb_build_object(
                    'locked_at', v_row.locked_at,
                    'stale_after', p_stale_after::text,
                    'request_hash', v_row.request_hash,
                    'idem_key', v_row.idem_key));  -- so a lost claim can say who holds the key now
        RAISE WARNING USING
            MESSAGE = pg_catalog.format('idem_claim: healed stale in-flight key_id %s on %s (lease taken at %s)',
                                        v_row.id, p_endpoint, v_row.locked_at),
            HINT = 'its worker died or hung past p_stale_after; check worker crashes and database latency';
        RETURN ROW('stale', v_row.id, v_hash, NULL, NULL, 100, NULL, NULL, NULL, NULL)::public.idem_claim_result;
    END LOOP;
END
$$;

COMMENT ON FUNCTION public.idem_claim IS
    'Claims (p_key, p_user_id, p_endpoint) for exactly one execution: the one round trip a request makes '
    'before its handler runs. Returns one idem_claim_result row whose outcome is: '
    'claimed (row inserted in_flight; key_id names the claim and claim_token, returned with this outcome only, '
    'is what idem_complete/idem_fail/idem_heartbeat need beside it), '
    'mismatch (same key, different request body), replay (completed: stored response returned, one '
    'audit_log row "idempotency_replay" written), in_flight (a live holder; retry_after_ms <= 5000 = time '
    'left on its lease; holder_elapsed_ms = how long the holder has held the key, from which a caller that knows '
    'the usual duration of the work can tell a shorter wait), stale (holder older than p_stale_after was healed: the key is free for the next '
    'claim; WARNING raised, event logged), previous_failed (the attempt failed). Expired keys are absent. '
    'p_wait_ms > 0 polls up to that long for an in-flight holder to finish (no session lock, no LISTEN: '
    'PgBouncer-safe); p_on_stale => ''quarantine'' '
    'answers in_flight until expiry instead of healing. '
    'A replay also returns response_headers, the headers stored by idem_complete (NULL for rows completed '
    'before the store kept them). A replayed body and headers stored encrypted are decrypted with p_response_key or '
    'p_response_key_fallback. '
    'request_hash is the hex SHA-256 of p_request::text (jsonb''s canonical text; NULL hashes as null); '
    'key_id of any other outcome is the row found (for logs); p_now is for tests and only the owner may pass it. '
    'p_key_format is the key rule (idem_canonical_key): ''uuid'' (the default), ''opaque'' (16 to 255 visible '
    'ASCII characters, as sent; a UUID is still lower-cased) or ''opaque_short'' (the same from 1 character). '
    'Errors: 22023 "Idempotency-Key must be a UUID string"; IDM00 a bad p_key_format, p_ttl (max 7 days), p_endpoint '
    '(empty, over 200 characters or with a control character: idem_refuse_endpoint; nothing is written), '
    'p_stale_after (below 1 second only for the owner and idem_admin), p_wait_ms or p_on_stale, or p_now from a role that does not own the store; IDM02 under pathological contention; IDM03 replay of an '
    'encrypted body without its key; 23503 (PostgreSQL) when p_user_id is not in users(id) (create the user first; NULL for a service call); '
    '42883 (PostgreSQL) when an argument name is misspelt, a required one is missing or a type does not match (no overloads: this signature is the only one).';
