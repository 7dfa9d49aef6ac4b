"""
Encrypted stored responses (contract §3: offered, off by default).

1. pgcrypto, in schema public, created only where absent. A Python step (like 0001) because the
   rollback must drop it only if this migration created it (marker comment): a host's own
   pgcrypto is never touched. The step runs the module's SQL, which ``idem sql`` prints as it is.
2. The DROP FUNCTION that the signature change needs: idem_claim, idem_complete and
   idem_export_user gain optional key parameters (sql/functions/ creates the new ones right
   after; never overloads). The rollback drops the new routines by name (there are no overloads).
"""
from yoyo import step

__depends__ = {"0003.operations"}

MARKER = "idem: created by migration 0004.response-encryption"

OLD_SIGNATURES = [
    "public.idem_claim(text, integer, text, jsonb, interval, interval, integer, text, timestamptz)",
    "public.idem_complete(bigint, integer, jsonb)",
    "public.idem_export_user(integer)",
]
NEW_ROUTINES = [
    "public.idem_reencrypt_responses",
    "public.idem_decrypt_response",
    "public.idem_encrypt_response",
    "public.idem_response_key_id",
    "public.idem_claim",
    "public.idem_complete",
    "public.idem_export_user",
]


# What the step runs, and what `idem sql` prints as it is.
SQL = f"""\
DO $response_encryption$
DECLARE
    v_schema text;
BEGIN
    SELECT extnamespace::regnamespace::text INTO v_schema FROM pg_extension WHERE extname = 'pgcrypto';
    IF v_schema IS NULL THEN
        CREATE EXTENSION pgcrypto WITH SCHEMA public;
        COMMENT ON EXTENSION pgcrypto IS '{MARKER}';
    ELSIF v_schema <> 'public' THEN
        RAISE EXCEPTION '0004: pgcrypto is installed in schema %, not public; run '
                        'ALTER EXTENSION pgcrypto SET SCHEMA public; then run idem migrate (or the idem sql script) again', v_schema;
    END IF;
END
$response_encryption$;
""" + "".join(f"DROP FUNCTION IF EXISTS {signature};\n" for signature in OLD_SIGNATURES)


def apply(conn):
    conn.cursor().execute(SQL)  # the module's constant, never input


def rollback(conn):
    cursor = conn.cursor()
    for name in NEW_ROUTINES:  # constants above, never input
        cursor.execute(f"DROP FUNCTION IF EXISTS {name}")
    cursor.execute("SELECT obj_description(oid, 'pg_extension') FROM pg_extension WHERE extname = 'pgcrypto'")
    row = cursor.fetchone()
    if row and row[0] == MARKER:
        cursor.execute("DROP EXTENSION pgcrypto")


steps = [step(apply, rollback)]
