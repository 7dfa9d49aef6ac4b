-- Last in the install, once every function file ran: they define the SQL API version this
-- package expects (idem.expected_version), else the build is broken and nothing is committed.
DO $idem_version_check$
DECLARE
    v_version constant integer := public.idem_schema_version();
BEGIN
    IF v_version IS DISTINCT FROM pg_catalog.current_setting('idem.expected_version')::integer THEN
        RAISE EXCEPTION 'sql/functions/ defines SQL API version %, but this package expects %: a broken build; %',
            v_version, pg_catalog.current_setting('idem.expected_version'), pg_catalog.current_setting('idem.unchanged');
    END IF;
END
$idem_version_check$;
