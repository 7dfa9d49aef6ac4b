-- idem_health
-- Aggregates only: no key, user id, hash or body leaves it, which is why the app role may
-- call it. Reads the whole table (one sequential scan, no locks): scrape it once a minute,
-- not once a request.
CREATE OR REPLACE FUNCTION public.idem_health(
    p_stale_after  interval    DEFAULT '30 seconds',
    p_recent       interval    DEFAULT '24 hours',
    p_now          timestamptz DEFAULT NULL
)
RETURNS TABLE (
    kind            text,
    scope_endpoint  text,
    state           text,
    total           bigint,
    stale           bigint,
    expired         bigint,
    oldest          interval,
    oldest_lease    interval,
    latest          timestamptz
)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- GUARD: both windows are positive
    IF p_stale_after IS NULL OR p_stale_after <= interval '0' OR p_recent IS NULL OR p_recent <= interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = 'idem_health: p_stale_after and p_recent must be positive intervals';
    END IF;

    IF p_now IS NOT NULL AND NOT public.idem_caller_is('owner') THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = 'idem_health: p_now is for tests: only the functions'' owner may pass it';
    END IF;
    p_now := COALESCE(p_now, pg_catalog.now());

    RETURN QUERY
    SELECT 'keys'::text, k.scope_endpoint, k.status,
           pg_catalog.count(*),
           pg_catalog.count(*) FILTER (WHERE k.status = 'in_flight' AND k.expires_at > p_now
                                         AND k.locked_at <= p_now - p_stale_after),
           pg_catalog.count(*) FILTER (WHERE k.expires_at <= p_now),
           p_now - pg_catalog.min(k.created_at),
           p_now - pg_catalog.min(k.locked_at) FILTER (WHERE k.status = 'in_flight'),
           pg_catalog.max(k.created_at)
      FROM public.idempotency_keys k
     GROUP BY k.scope_endpoint, k.status
    UNION ALL
    SELECT 'event'::text, e.scope_endpoint, e.event,
           pg_catalog.count(*), NULL::bigint, NULL::bigint,
           p_now - pg_catalog.min(e.occurred_at), NULL::interval,
           pg_catalog.max(e.occurred_at)
      FROM public.idempotency_events e
     WHERE e.occurred_at > p_now - p_recent
     GROUP BY e.scope_endpoint, e.event
     ORDER BY 1 DESC, 2 NULLS LAST, 3;
END
$$;

COMMENT ON FUNCTION public.idem_health IS
    'Aggregates only. kind=keys rows: per (scope_endpoint, state=status) total rows, stale (in_flight '
    'with locked_at older than p_stale_after, waiting for a heal), expired (waiting for cleanup), oldest '
    '(age of the oldest row), oldest_lease (in_flight: age of the oldest lease), latest (newest created_at). '
    'kind=event rows: per (scope_endpoint, state=event: stale_heal, lost_claim, erasure) the count in the '
    'last p_recent, oldest and latest occurrence. One scan of the table: for a DBA, `flask idempotency '
    'stats` and a metrics exporter, once a minute. Errors: IDM00 non-positive window.';
