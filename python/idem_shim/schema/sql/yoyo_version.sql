-- yoyo's version row (its internal schema 2), as yoyo records it, once owners.sql has checked,
-- after yoyo_tables.sql, that its tables are the store owner's or a superuser's.
INSERT INTO public."_yoyo_version" ("version", "installed_at_utc")
SELECT 2, now() AT TIME ZONE 'UTC'
 WHERE NOT EXISTS (SELECT 1 FROM public."_yoyo_version" WHERE "version" = 2);
