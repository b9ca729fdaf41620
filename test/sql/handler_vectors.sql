--
-- Handler validation against test/vectors/handler_options.tsv, the one table
-- of good and bad handlers (name, kind, target, options) that the extension
-- (relay._validate_handler in C, src/core/handler_config.cpp) and the managed
-- SQL edition (its PL/pgSQL port, sql/managed/internal.sql) are both tested
-- against: each row's expected column is 'ok' or 'SQLSTATE: message (detail)'.
-- Columns: label, name, kind, target (\N: NULL), options, expected.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS relaybus;
RESET client_min_messages;
\set SHOW_CONTEXT never

CREATE TEMP TABLE hv (n serial, label text, name text, kind text, target text, options text, expected text);
\copy hv (label, name, kind, target, options, expected) FROM 'test/vectors/handler_options.tsv'

CREATE FUNCTION pg_temp.validate(name text, kind text, target text, options text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    detail text;
BEGIN
    PERFORM relay._validate_handler(name, kind, target, options::jsonb);
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL;
    RETURN SQLSTATE || ': ' || SQLERRM || coalesce(' (' || nullif(detail, '') || ')', '');
END
$$;

SELECT count(*) AS vectors, count(*) FILTER (WHERE expected = 'ok') AS good FROM hv;
-- Every row as the table says (no rows: all agree).
SELECT n, label, expected, actual
  FROM (SELECT hv.*, pg_temp.validate(name, kind, target, options) AS actual FROM hv) v
 WHERE actual IS DISTINCT FROM expected
 ORDER BY n;
