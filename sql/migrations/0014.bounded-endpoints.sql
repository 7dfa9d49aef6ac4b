-- Bounded observability (issue 39, F5): idem_health takes the scopes an exporter declares
-- (p_scopes) or names the p_top busiest endpoints, and folds every other endpoint text into one
-- row per state, so a member of idem_app claiming under made-up endpoints makes no series of its
-- own. Its signature changes: the view over it goes first, then the three-argument function;
-- sql/functions/ creates both right after, and 990_privileges grants them to idem_monitor and
-- idem_admin again (a grant a DBA made on the view by hand to another role is to be made again).
-- depends: 0013.client-options
DROP VIEW IF EXISTS public.idem_health;
DROP FUNCTION IF EXISTS public.idem_health(interval, interval, timestamptz);
