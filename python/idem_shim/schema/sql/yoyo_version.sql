-- yoyo's version row (its internal schema 2), as yoyo records it, once owners.sql has checked,
-- after yoyo_tables.sql, that its tables are the store owner's or a superuser's; none where an
-- older yoyo's tables have no version table yet (yoyo upgrades them itself: idem migrate).
DO $idem_yoyo_version$
BEGIN
    IF pg_catalog.to_regclass('public._yoyo_version') IS NOT NULL THEN
        INSERT INTO public."_yoyo_version" ("version", "installed_at_utc")
        SELECT 2, pg_catalog.timezone('UTC', pg_catalog.now())
         WHERE NOT EXISTS (SELECT 1 FROM public."_yoyo_version" WHERE "version" OPERATOR(pg_catalog.=) 2);
    END IF;
END
$idem_yoyo_version$;
