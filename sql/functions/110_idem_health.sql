-- idem_health
-- Aggregates only: no key, user id, hash or body leaves it, which is why the app role may
-- call it. Reads the whole table (one sequential scan, no locks): scrape it once a minute,
-- not once a request. Its rows are bounded whatever the table holds: the endpoints it names are
-- the caller's p_scopes (an exporter's declared scopes), else the p_top busiest; every other
-- endpoint text (a member of idem_app can claim under any) is one row per state, endpoint NULL.
CREATE OR REPLACE FUNCTION public.idem_health(
    p_stale_after  interval    DEFAULT '30 seconds',
    p_recent       interval    DEFAULT '24 hours',
    p_now          timestamptz DEFAULT NULL,
    p_scopes       text[]      DEFAULT NULL,
    p_top          integer     DEFAULT 50
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
DECLARE
    -- first: a caller's collation would decide which endpoints match a scope (idem_refuse_collation)
    v_uncollated  constant boolean := (pg_catalog.pg_collation_for(p_scopes) COLLATE pg_catalog."C") OPERATOR(pg_catalog.=) '"default"'
                                      OR public.idem_refuse_collation('idem_health', pg_catalog.pg_collation_for(p_scopes));
BEGIN
    -- GUARD: both windows are positive
    IF p_stale_after IS NULL OR p_stale_after <= interval '0' OR p_recent IS NULL OR p_recent <= interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = 'idem_health: p_stale_after and p_recent must be positive intervals';
    END IF;
    -- GUARD: the rows stay bounded (an exporter's series, a DBA's screen)
    IF p_top IS NULL OR p_top < 0 OR p_top > 1000 OR pg_catalog.cardinality(p_scopes) > 1000 THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = pg_catalog.format('idem_health: p_top must be between 0 and 1000 and p_scopes hold at most 1000 '
                                        'scopes (got p_top %s, %s scopes)', COALESCE(p_top::text, 'NULL'),
                                        COALESCE(pg_catalog.cardinality(p_scopes), 0));
    END IF;

    IF p_now IS NOT NULL AND NOT public.idem_caller_is('owner') THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = 'idem_health: p_now is for tests: only the functions'' owner may pass it';
    END IF;
    p_now := COALESCE(p_now, pg_catalog.now());

    -- Grouped by the stored text first (one scan, today's hash aggregate), then each group joins
    -- the named endpoints: the groups no name matches fold into the NULL endpoint.
    RETURN QUERY
    WITH keys AS (
        SELECT k.scope_endpoint AS endpoint, k.status,
               pg_catalog.count(*) AS total,
               pg_catalog.count(*) FILTER (WHERE k.status = 'in_flight' AND k.expires_at > p_now
                                             AND k.locked_at <= p_now - p_stale_after) AS stale,
               pg_catalog.count(*) FILTER (WHERE k.expires_at <= p_now) AS expired,
               pg_catalog.min(k.created_at) AS first_at,
               pg_catalog.min(k.locked_at) FILTER (WHERE k.status = 'in_flight') AS lease_at,
               pg_catalog.max(k.created_at) AS last_at
          FROM public.idempotency_keys k
         GROUP BY k.scope_endpoint, k.status
    ), named AS (
        SELECT DISTINCT s.endpoint
          FROM pg_catalog.unnest(p_scopes) AS s(endpoint)
         WHERE s.endpoint IS NOT NULL
        UNION ALL
        SELECT busiest.endpoint
          FROM (SELECT g.endpoint, pg_catalog.sum(g.total) AS rows_held
                  FROM keys g
                 GROUP BY g.endpoint
                 ORDER BY rows_held DESC, g.endpoint
                 LIMIT p_top) busiest
         WHERE p_scopes IS NULL
    ), events AS (
        SELECT e.scope_endpoint AS endpoint, e.event,
               pg_catalog.count(*) AS total,
               pg_catalog.min(e.occurred_at) AS first_at,
               pg_catalog.max(e.occurred_at) AS last_at
          FROM public.idempotency_events e
         WHERE e.occurred_at > p_now - p_recent
         GROUP BY e.scope_endpoint, e.event
    )
    SELECT 'keys'::text, n.endpoint, g.status,
           pg_catalog.sum(g.total)::bigint, pg_catalog.sum(g.stale)::bigint, pg_catalog.sum(g.expired)::bigint,
           p_now - pg_catalog.min(g.first_at), p_now - pg_catalog.min(g.lease_at), pg_catalog.max(g.last_at)
      FROM keys g LEFT JOIN named n ON n.endpoint = g.endpoint
     GROUP BY n.endpoint, g.status
    UNION ALL
    SELECT 'event'::text, n.endpoint, v.event,
           pg_catalog.sum(v.total)::bigint, NULL::bigint, NULL::bigint,
           p_now - pg_catalog.min(v.first_at), NULL::interval, pg_catalog.max(v.last_at)
      FROM events v LEFT JOIN named n ON n.endpoint = v.endpoint
     GROUP BY n.endpoint, v.event
     ORDER BY 1 DESC, 2 NULLS LAST, 3;
END
$$;

COMMENT ON FUNCTION public.idem_health IS
    'Aggregates only. kind=keys rows: per (scope_endpoint, state=status) total rows, stale (in_flight '
    'with locked_at older than p_stale_after, waiting for a heal), expired (waiting for cleanup), oldest '
    '(age of the oldest row), oldest_lease (in_flight: age of the oldest lease), latest (newest created_at). '
    'kind=event rows: per (scope_endpoint, state=event: stale_heal, lost_claim, erasure, released) the count in the '
    'last p_recent, oldest and latest occurrence. Bounded rows: scope_endpoint is one of p_scopes (the scopes an '
    'exporter declares; each named only when it has rows), or with p_scopes NULL one of the p_top endpoints holding '
    'the most rows; every other endpoint (and an erasure, which has none) is aggregated in rows whose '
    'scope_endpoint is NULL. One scan of the table: for a DBA, `flask idempotency stats` and a metrics exporter, '
    'once a minute. Errors: IDM00 non-positive window, p_top outside 0..1000, more than 1000 p_scopes, a collation '
    'on p_scopes, p_now from a caller other than the owner.';
