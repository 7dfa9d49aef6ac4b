-- yoyo-migrations' bookkeeping, exactly as yoyo creates it, so that `idem migrate` (through yoyo)
-- and the idem sql script each see what the other applied. Made where absent, so kept where another
-- role made it: idem's DDL guard judges no new table, so the database's owner may make one of these
-- at any moment (while the install waits for the transactions older than the guard, say), with a
-- trigger, as a view… The install plan (schema/plan.py) therefore runs owners.sql right after this
-- file, and writes or reads these tables (yoyo_version.sql, yoyo's lock) only then. Where an older
-- yoyo's tables are there (no version table yet), only the lock table is made: yoyo upgrades its
-- own (idem migrate).
DO $idem_yoyo_tables$
BEGIN
    CREATE TABLE IF NOT EXISTS public."yoyo_lock" (
        "locked" INT DEFAULT 1, "ctime" TIMESTAMP,"pid" INT NOT NULL,PRIMARY KEY ("locked"));
    IF pg_catalog.to_regclass('public._yoyo_migration') IS NOT NULL
       AND pg_catalog.to_regclass('public._yoyo_version') IS NULL THEN
        RETURN;
    END IF;
    CREATE TABLE IF NOT EXISTS public."_yoyo_migration" (
        "migration_hash" VARCHAR(64),
        "migration_id" VARCHAR(255),
        "applied_at_utc" TIMESTAMP,
        PRIMARY KEY ("migration_hash")
    );
    CREATE TABLE IF NOT EXISTS public."_yoyo_log" (
        "id" VARCHAR(36),
        "migration_hash" VARCHAR(64),
        "migration_id" VARCHAR(255),
        "operation" VARCHAR(10),
        "username" VARCHAR(255),
        "hostname" VARCHAR(255),
        "comment" VARCHAR(255),
        "created_at_utc" TIMESTAMP,
        PRIMARY KEY ("id")
    );
    CREATE TABLE IF NOT EXISTS public."_yoyo_version" (
        "version" INT NOT NULL PRIMARY KEY,
        "installed_at_utc" TIMESTAMP
    );
END
$idem_yoyo_tables$;
