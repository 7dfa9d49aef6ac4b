-- idem_health (view)
-- So a DBA can type `SELECT * FROM public.idem_health;`. Aggregates only, so the app role may read it.
CREATE OR REPLACE VIEW public.idem_health AS
SELECT h.kind, h.scope_endpoint, h.state, h.total, h.stale, h.expired, h.oldest, h.oldest_lease, h.latest
  FROM public.idem_health() h;

COMMENT ON VIEW public.idem_health IS
    'Health of the idempotency store (aggregates only): idem_health() with p_stale_after 30 s, '
    'p_recent 24 h and its defaults for the endpoints it names (the 50 holding the most rows; every other one '
    'in rows whose scope_endpoint is NULL). kind=keys: rows, stale holders, expired rows and ages per endpoint '
    'and status; kind=event: stale heals, lost claims, releases and erasures of the last 24 h.';
