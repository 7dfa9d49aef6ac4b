-- The completion becomes a HOT update and writes no index entry (it wrote 4): no index names
-- `status` any more, neither as a column nor in a predicate, and each heap page keeps 10 % free
-- for the completed versions of the rows claimed into it (fillfactor 90: all completions were
-- HOT with 8 clients, as with 70, for less heap; it applies to pages filled from now on). The expiry index covers every row: the cleanup finds finished and
-- orphaned in-flight rows in it alike, so the in-flight index is not needed. The claim still
-- writes 4 entries (primary key, unique key, user, expiry). bench/README.md has the figures.
-- depends: 0006.response-headers
CREATE INDEX idx_idem_keys_expires_all ON public.idempotency_keys (expires_at);
DROP INDEX public.idx_idem_keys_expires;
ALTER INDEX public.idx_idem_keys_expires_all RENAME TO idx_idem_keys_expires;
DROP INDEX public.idx_idem_keys_in_flight;
ALTER TABLE public.idempotency_keys SET (fillfactor = 90);
