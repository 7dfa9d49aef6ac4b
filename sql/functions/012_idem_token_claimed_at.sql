-- idem_token_claimed_at
-- No search_path setting: a SQL-standard body, whose names (all qualified or exactly typed) are bound when it is created (contract §3a).
-- The claim time a token names (its last 16 hex digits: microseconds since 1970), which the
-- routines acting on a claim compare with the row's created_at after checking the token's hash:
-- so the check stays one hash, and a token of an earlier claim with the same key_id finds no
-- row. A SQL-standard expression, inlined; exact (whole seconds and the microseconds apart).
-- Only a time after 1970 and before 2^60 microseconds from it: anything else is no token of
-- idem_claim_token's, and NULL (a refused token), never a timestamp out of range. The shape is
-- checked by length and one unbounded regex: a bounded one ({32}) costs twice as much per call.
CREATE OR REPLACE FUNCTION public.idem_token_claimed_at(p_claim_token text)
RETURNS timestamptz
LANGUAGE sql
STABLE
PARALLEL SAFE
RETURN CASE WHEN pg_catalog.octet_length(p_claim_token) OPERATOR(pg_catalog.=) 48
                 AND pg_catalog.substr(p_claim_token, 33, 1) OPERATOR(pg_catalog.=) '0'
                 AND p_claim_token OPERATOR(pg_catalog.~) '^[0-9a-f]*$' THEN
           pg_catalog.to_timestamp(
               (('x' || pg_catalog.substr(p_claim_token, 33, 16))::bit(64)::bigint / 1000000)::double precision)
           + (('x' || pg_catalog.substr(p_claim_token, 33, 16))::bit(64)::bigint % 1000000) * interval '1 microsecond'
       END;

COMMENT ON FUNCTION public.idem_token_claimed_at IS
    'The claim time (created_at) a claim token of idem_claim_token names; NULL for anything that is not 48 '
    'lower-case hex digits naming a time between 1970 and 2^60 microseconds after it (a missing, malformed or '
    'older, key_id-only token). Internal: no role may execute it. Errors: none.';
