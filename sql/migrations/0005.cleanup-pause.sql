-- idem_cleanup gains p_pause_ms (a pause between batches); sql/functions/080 creates the new
-- signature right after this migration. Never overloads: the old one goes.
-- depends: 0004.response-encryption
DROP PROCEDURE IF EXISTS public.idem_cleanup(integer, bigint);
