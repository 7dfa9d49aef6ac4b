-- idem_downstream_key
-- The key a handler forwards to a broker (client_order_id) or to Stripe (Idempotency-Key): a
-- keyed SHA-256 under idem_secret of (key, user scope, endpoint, namespace), so every execution
-- of a request, across any number of stale heals, sends the same one, and it reveals neither the
-- client's key nor the user. Each field is length-prefixed (the user as a flag and its 4, 8 or 16 bytes), so
-- no two tuples share an encoding. Reads the one-row secret; locks nothing; one round trip.
CREATE OR REPLACE FUNCTION public.idem_downstream_key(
    p_key        text,
    p_user_id    public.idem_user_id,
    p_endpoint   text,
    p_namespace  text,
    p_key_format text DEFAULT 'uuid'
)
RETURNS text
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- first: a caller's collation would reach every text parameter and variable (idem_refuse_collation)
    v_uncollated  constant boolean := (pg_catalog.pg_collation_for(p_key) COLLATE pg_catalog."C") OPERATOR(pg_catalog.=) '"default"'
                                      OR public.idem_refuse_collation('idem_downstream_key', pg_catalog.pg_collation_for(p_key));
    v_key     text := public.idem_canonical_key(p_key, p_key_format);
    v_digest  bytea;
    v_user    bytea;
    v_hex     text;
BEGIN
    -- GUARD: arguments (misuse raises)
    IF p_endpoint IS NULL OR p_endpoint = '' THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = 'idem_downstream_key: p_endpoint must be the non-empty endpoint scope of the claim';
    END IF;
    -- GUARD: a name the shim would never send (too long for a label, a control character):
    -- refused before anything is written (idem_refuse_endpoint says the rule)
    IF pg_catalog.length(p_endpoint) > 200
       OR p_endpoint ~ E'[\\x01-\\x1f\\x7f-\\x9f\\u2028\\u2029\\u202a-\\u202e\\u2066-\\u2069]' THEN
        PERFORM public.idem_refuse_endpoint('idem_downstream_key', p_endpoint);
    END IF;
    IF p_namespace IS NULL OR p_namespace = '' THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = 'idem_downstream_key: p_namespace must be a non-empty name of the downstream call (e.g. ''broker'')';
    END IF;

    -- The user as a flag and its bytes, by the store's user id type (migration 0017, fixed at
    -- install): an integer store keeps the encoding it had before 0017, so its keys do not change.
    -- Each cast goes through text, which every base type has: only the branch taken is planned.
    IF p_user_id IS NULL THEN
        v_user := E'\\x00'::bytea;
    ELSIF public.idem_user_id_type() OPERATOR(pg_catalog.=) 'integer'::pg_catalog.regtype THEN
        v_user := E'\\x01'::bytea || pg_catalog.int4send(p_user_id::text::integer);
    ELSIF public.idem_user_id_type() OPERATOR(pg_catalog.=) 'bigint'::pg_catalog.regtype THEN
        v_user := E'\\x02'::bytea || pg_catalog.int8send(p_user_id::text::bigint);
    ELSE
        v_user := E'\\x03'::bytea || pg_catalog.uuid_send(p_user_id::text::uuid);
    END IF;

    SELECT pg_catalog.sha256(
               s.secret
               || pg_catalog.convert_to('downstream:', 'UTF8')
               || pg_catalog.int4send(pg_catalog.octet_length(pg_catalog.convert_to(v_key, 'UTF8')))
               || pg_catalog.convert_to(v_key, 'UTF8')
               || v_user
               || pg_catalog.int4send(pg_catalog.octet_length(pg_catalog.convert_to(p_endpoint, 'UTF8')))
               || pg_catalog.convert_to(p_endpoint, 'UTF8')
               || pg_catalog.int4send(pg_catalog.octet_length(pg_catalog.convert_to(p_namespace, 'UTF8')))
               || pg_catalog.convert_to(p_namespace, 'UTF8'))
      INTO v_digest
      FROM public.idem_secret s;
    -- GUARD: no secret before migration 0008
    IF v_digest IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = 'idem_downstream_key: the store has no secret (idem_secret is empty): run idem migrate';
    END IF;

    -- The first 128 bits as an RFC 9562 version-8 (custom) UUID: version nibble 8, variant 10.
    v_digest := pg_catalog.set_byte(pg_catalog.set_byte(pg_catalog.substr(v_digest, 1, 16),
                    6, (pg_catalog.get_byte(v_digest, 6) & 15) | 128),
                    8, (pg_catalog.get_byte(v_digest, 8) & 63) | 128);
    v_hex := pg_catalog.encode(v_digest, 'hex');
    RETURN pg_catalog.substr(v_hex, 1, 8) || '-' || pg_catalog.substr(v_hex, 9, 4) || '-'
        || pg_catalog.substr(v_hex, 13, 4) || '-' || pg_catalog.substr(v_hex, 17, 4) || '-'
        || pg_catalog.substr(v_hex, 21, 12);
END
$$;

COMMENT ON FUNCTION public.idem_downstream_key IS
    'The downstream key of (p_key, p_user_id, p_endpoint, p_namespace): a lower-case version-8 UUID string, '
    'a keyed SHA-256 under the store''s secret, the same for every execution of that request across stale heals '
    'and different for another key, user, endpoint scope or namespace; it reveals neither the key nor the user. '
    'What idem_shim.downstream_key(namespace) returns inside a claimed request, so a DBA can match a broker''s '
    'client_order_id or a Stripe Idempotency-Key to its idempotency key (docs/operations.md). p_user_id NULL is a '
    'service call; p_key_format is the claim''s key rule (''uuid'', the default, or ''opaque'': idem_canonical_key). '
    'Errors: 22023 "Idempotency-Key must be a UUID string"; IDM00 an empty p_endpoint (or one over 200 characters or '
    'with a control character: idem_refuse_endpoint) or p_namespace, a bad '
    'p_key_format, or a store without its secret.';
