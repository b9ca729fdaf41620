DO $revoke$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid FROM pg_catalog.pg_proc p
              WHERE p.pronamespace = 'relay'::regnamespace
                 OR (p.proname LIKE 'relay\_%'
                     AND p.pronamespace = (SELECT q.pronamespace FROM pg_catalog.pg_proc q
                                            WHERE q.oid = 'relay_publish(text, jsonb, text, jsonb, integer, timestamptz, text)'::regprocedure))
    LOOP
        EXECUTE pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$revoke$;
