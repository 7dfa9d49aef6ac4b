-- Undo 0003, and drop what sql/functions/1xx_*.sql created on top of it (views first).
DROP VIEW IF EXISTS public.idem_health;
DROP FUNCTION IF EXISTS public.idem_health;
DROP FUNCTION IF EXISTS public.idem_inspect;
DROP FUNCTION IF EXISTS public.idem_record_lost_claim;
DROP FUNCTION IF EXISTS public.idem_schedule_cleanup;
DROP FUNCTION IF EXISTS public.idem_cleanup_job;  -- after the schedule, whose default calls it
DROP INDEX IF EXISTS public.uq_idem_events_lost_claim;
DROP INDEX IF EXISTS public.idx_idem_events_key_id;
