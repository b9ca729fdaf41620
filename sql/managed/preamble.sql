-- The managed SQL edition of relaybus (docs/managed.md): plain SQL and
-- PL/pgSQL, no library. Install it as the database owner with
--   psql -1 -v ON_ERROR_STOP=1 -f relaybus-managed--VERSION.sql
DO $preamble$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_extension e WHERE e.extname = 'relaybus') THEN
        RAISE EXCEPTION 'the relaybus extension is installed in this database'
            USING ERRCODE = 'duplicate_object',
                  HINT = 'One database holds one edition of relaybus (docs/managed.md).';
    END IF;
END
$preamble$;
