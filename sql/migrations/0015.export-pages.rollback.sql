-- Undo 0015: the function that returns a row per key; loading sql/functions/ of the previous
-- version re-creates idem_export_user returning one jsonb array.
DROP FUNCTION IF EXISTS public.idem_export_user;
