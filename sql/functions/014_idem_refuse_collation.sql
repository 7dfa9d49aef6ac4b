-- idem_refuse_collation
-- A PL/pgSQL routine takes the collation of its call for every text parameter and every text
-- variable it declares: a caller's COLLATE (a case-blind or other nondeterministic one, an ICU
-- rule that makes digits equal) would decide how a definer compares tokens, keys and names. So
-- every SECURITY DEFINER routine with a text parameter refuses a call whose collation is not the
-- database's default, as its first declaration:
--   v_uncollated constant boolean := (pg_catalog.pg_collation_for(p_x) COLLATE pg_catalog."C")
--       OPERATOR(pg_catalog.=) '"default"' OR public.idem_refuse_collation('<routine>', pg_catalog.pg_collation_for(p_x));
-- (compared under "C": a collation named DEFAULT cannot pass for it). This is the refusal, in its
-- own routine so that only a refused call pays for it. Raises, always; reads nothing.
CREATE OR REPLACE FUNCTION public.idem_refuse_collation(p_routine text, p_collation text)
RETURNS boolean
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION USING
        ERRCODE = 'IDM00',
        MESSAGE = pg_catalog.format('%s: text arguments must not carry a collation (got %s)', p_routine, p_collation),
        HINT    = 'leave COLLATE out of the call: idem compares keys, tokens and names under the database''s default collation';
END
$$;

COMMENT ON FUNCTION public.idem_refuse_collation IS
    'Raises IDM00 "<p_routine>: text arguments must not carry a collation (got <p_collation>)": what every '
    'SECURITY DEFINER routine with a text parameter raises first when its call carries a collation other than '
    'the database''s default (a COLLATE clause, a column of another collation). Internal: no role may execute it. '
    'Errors: IDM00, always.';
