"""
Encrypted stored responses (contract §3: offered, off by default).

1. pgcrypto, in schema public, created only where absent. A Python step (like 0001) because the
   rollback must drop it only if this migration created it (marker comment): a host's own
   pgcrypto is never touched.
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


def apply(conn):
    cursor = conn.cursor()
    cursor.execute("SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'pgcrypto'")
    row = cursor.fetchone()
    if row is None:
        cursor.execute("CREATE EXTENSION pgcrypto WITH SCHEMA public")
        cursor.execute(f"COMMENT ON EXTENSION pgcrypto IS '{MARKER}'")  # a constant, never input
    elif row[0] != "public":
        # The functions name public.pgp_sym_encrypt & co.: elsewhere those names could be planted
        # (idem migrate's preflight refuses this first; this is the step's own guard).
        raise RuntimeError(f"0004: pgcrypto is installed in schema {row[0]}, not public; run "
                           "ALTER EXTENSION pgcrypto SET SCHEMA public; then migrate again")
    for signature in OLD_SIGNATURES:  # constants above, never input
        cursor.execute(f"DROP FUNCTION IF EXISTS {signature}")


def rollback(conn):
    cursor = conn.cursor()
    for name in NEW_ROUTINES:  # constants above, never input
        cursor.execute(f"DROP FUNCTION IF EXISTS {name}")
    cursor.execute("SELECT obj_description(oid, 'pg_extension') FROM pg_extension WHERE extname = 'pgcrypto'")
    row = cursor.fetchone()
    if row and row[0] == MARKER:
        cursor.execute("DROP EXTENSION pgcrypto")


steps = [step(apply, rollback)]

# The same effect in SQL, for `idem sql` (one script a DBA applies with psql).
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
                        'ALTER EXTENSION pgcrypto SET SCHEMA public; then apply this script again', v_schema;
    END IF;
END
$response_encryption$;
""" + "".join(f"DROP FUNCTION IF EXISTS {signature};\n" for signature in OLD_SIGNATURES)
