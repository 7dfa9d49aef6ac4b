-- Interoperability (issue 41): p_key_format 'opaque_short', an opaque key of 1 to 255 visible
-- ASCII characters, for a caller that enforces a minimum of its own below 16 (the shim's
-- IDEM_OPAQUE_KEY_MIN_LENGTH; the IETF draft sets none). The CHECK on idem_key admits those keys
-- as sent. The new CHECK is implied by the old one, which every row met, so its validating scan
-- finds nothing (it reads the table once, under this migration's lock). No signature changes.
-- depends: 0015.export-pages
ALTER TABLE public.idempotency_keys DROP CONSTRAINT ck_idem_key_canonical;
ALTER TABLE public.idempotency_keys ADD CONSTRAINT ck_idem_key_canonical
    CHECK (idem_key ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
           OR (idem_key ~ '^[!-~]{1,255}$'
               AND idem_key !~ '^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$'));
