-- idem_inspect
-- For DBAs only (not granted to the app role): it shows keys and, on request, bodies and
-- headers. Encrypted ones stay ciphertext: the key is the app's. Reads only; takes no lock.
CREATE OR REPLACE FUNCTION public.idem_inspect(
    p_key        text,
    p_user_id    public.idem_user_id DEFAULT NULL,
    p_endpoint   text    DEFAULT NULL,
    p_with_body  boolean DEFAULT false,
    p_key_format text    DEFAULT 'uuid'
)
RETURNS TABLE (
    key_id          bigint,
    idem_key        text,
    scope_user_id   public.idem_user_id,
    scope_endpoint  text,
    status          text,
    request_hash    text,
    response_code   smallint,
    body_stored     boolean,
    body_encrypted  boolean,
    response_body   jsonb,
    headers_stored  boolean,
    response_headers jsonb,
    created_at      timestamptz,
    locked_at       timestamptz,
    expires_at      timestamptz,
    lease_age       interval,
    is_expired      boolean,
    events          jsonb
)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- first: a caller's collation would reach every text parameter and variable (idem_refuse_collation)
    v_uncollated  constant boolean := (pg_catalog.pg_collation_for(p_key) COLLATE pg_catalog."C") OPERATOR(pg_catalog.=) '"default"'
                                      OR public.idem_refuse_collation('idem_inspect', pg_catalog.pg_collation_for(p_key));
    v_key text := public.idem_canonical_key(p_key, p_key_format);
    -- read once, here: on a distributed store the query below runs on a worker, whose own now()
    -- is its transaction's, not this one's; and the scope service calls are stored under
    -- (NULL on a single node, 0 on Citus), shown as NULL either way
    v_now     constant timestamptz := pg_catalog.now();
    v_service constant public.idem_user_id := public.idem_scope(NULL::public.idem_user_id);
BEGIN
    RETURN QUERY
    SELECT k.id, k.idem_key, NULLIF(k.scope_user_id, v_service)::public.idem_user_id, k.scope_endpoint, k.status, k.request_hash,
           k.response_code,
           k.response_body IS NOT NULL,
           COALESCE(k.response_body ? 'idem_enc', false),
           CASE WHEN p_with_body THEN k.response_body END,
           k.response_headers IS NOT NULL,
           CASE WHEN p_with_body THEN k.response_headers END,
           k.created_at, k.locked_at, k.expires_at,
           v_now - k.locked_at,
           k.expires_at <= v_now,
           (SELECT COALESCE(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
                       'event', e.event, 'occurred_at', e.occurred_at, 'detail', e.detail)
                       ORDER BY e.occurred_at), '[]'::jsonb)
              FROM public.idempotency_events e
             WHERE e.key_id = k.id AND public.idem_scope_join(e.scope_user_id, k.scope_user_id))  -- its shard
      FROM public.idempotency_keys k
     WHERE k.idem_key = v_key
       AND (p_user_id IS NULL OR k.scope_user_id = p_user_id)
       AND (p_endpoint IS NULL OR k.scope_endpoint = p_endpoint)
     ORDER BY k.scope_endpoint, NULLIF(k.scope_user_id, v_service) NULLS FIRST;
END
$$;

COMMENT ON FUNCTION public.idem_inspect IS
    'Shows every row of Idempotency-Key p_key (narrowed by p_user_id / p_endpoint when given) with all '
    'three scope columns, status, lease age, expiry and its stale_heal/lost_claim events. The stored body '
    'and response headers only when p_with_body => true (encrypted ones stay ciphertext); '
    'headers_stored says whether headers were kept. Expired rows are shown with '
    'is_expired = true (claims already treat them as absent). p_key_format is the route''s key rule (''uuid'', the '
    'default, or ''opaque'': idem_canonical_key), so an opaque key is found as the client sent it. Errors: 22023 '
    '"Idempotency-Key must be a UUID string"; IDM00 a bad p_key_format.';
