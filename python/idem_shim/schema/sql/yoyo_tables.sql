-- yoyo-migrations' bookkeeping, exactly as yoyo creates it, so a later `idem migrate` sees what
-- this script applied.
CREATE TABLE IF NOT EXISTS public."yoyo_lock" (
    "locked" INT DEFAULT 1, "ctime" TIMESTAMP,"pid" INT NOT NULL,PRIMARY KEY ("locked"));
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
INSERT INTO public."_yoyo_version" ("version", "installed_at_utc")
SELECT 2, now() AT TIME ZONE 'UTC'
 WHERE NOT EXISTS (SELECT 1 FROM public."_yoyo_version" WHERE "version" = 2);
