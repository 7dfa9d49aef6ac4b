-- What a client of a route meets: a Retry-After that fits the holder, and keys that are not
-- UUIDs. idem_claim_result gains holder_elapsed_ms (how long an in-flight holder has held the key,
-- from which the shim estimates the time it still needs); every routine that takes a key gains
-- p_key_format ('uuid', the default and contract §4b's key rule, or 'opaque': 16 to 255 visible ASCII
-- characters), so the CHECK on idem_key admits an opaque key as sent beside a canonical UUID.
-- The new CHECK is implied by the old one, which every row met, so its validating scan finds
-- nothing (it reads the table once, under this migration's lock). The routines whose signature
-- changes are dropped (the key check before the refusal it is built on); sql/functions/ creates
-- them right after.
-- depends: 0012.claim-bound-tokens
ALTER TYPE public.idem_claim_result ADD ATTRIBUTE holder_elapsed_ms integer;
ALTER TABLE public.idempotency_keys DROP CONSTRAINT ck_idem_key_canonical;
ALTER TABLE public.idempotency_keys ADD CONSTRAINT ck_idem_key_canonical
    CHECK (idem_key ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
           OR (idem_key ~ '^[!-~]{16,255}$'
               AND idem_key !~ '^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$'));
DROP FUNCTION IF EXISTS public.idem_claim;
DROP FUNCTION IF EXISTS public.idem_downstream_key;
DROP FUNCTION IF EXISTS public.idem_inspect;
DROP FUNCTION IF EXISTS public.idem_canonical_key;
DROP FUNCTION IF EXISTS public.idem_refuse_key;
