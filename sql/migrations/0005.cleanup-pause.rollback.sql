-- Undo 0005: drop the three-argument procedure; the two-argument one of 0002 is re-created by
-- loading sql/functions/ of that version.
DROP PROCEDURE IF EXISTS public.idem_cleanup;
