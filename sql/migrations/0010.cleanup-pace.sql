-- idem_cleanup gains p_max_rows_per_second (its pace; NULL runs unpaced), and
-- idem_cleanup_plan says whether that pace finishes before the next daily run. sql/functions/
-- creates the new signature right after this migration. Never overloads: the old one goes.
-- depends: 0009.release-on-failure
DROP PROCEDURE IF EXISTS public.idem_cleanup(integer, bigint, integer);
