-- Undo 0014: the view and the function that takes p_scopes and p_top; loading sql/functions/ of
-- the previous version re-creates idem_health as it was.
DROP VIEW IF EXISTS public.idem_health;
DROP FUNCTION IF EXISTS public.idem_health(interval, interval, timestamptz, text[], integer);
