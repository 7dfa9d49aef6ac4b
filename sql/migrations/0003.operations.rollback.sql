-- Undo 0003, and drop what sql/functions/1xx_*.sql created on top of it (views first).
DROP FUNCTION IF EXISTS public.idem_schedule_cleanup(text);
DROP INDEX IF EXISTS public.idx_idem_events_key_id;
