-- Undo 0010: drop the paced procedure and its plan; the three-argument procedure of 0005 is
-- re-created by loading sql/functions/ of that version.
DROP PROCEDURE IF EXISTS public.idem_cleanup(integer, bigint, integer, integer);
DROP FUNCTION IF EXISTS public.idem_cleanup_plan(integer, interval);
