--
-- A caller's search_path cannot redirect relaybus: its statements run with
-- search_path = 'pg_catalog, pg_temp' (src/pg/spi_support.cpp), whatever the
-- caller's is, and the caller's is intact afterwards, after an error too.
-- The caller here lists a schema before pg_catalog whose = operators on int4
-- and int8 and whose unnest() raise, and publishes, claims, acks and changes
-- routes under it. Objects are prefixed spt_ / spt. so that this file does not
-- depend on the others.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS relaybus;
RESET client_min_messages;
\set SHOW_CONTEXT never

CREATE SCHEMA spt_trap;
CREATE FUNCTION spt_trap.eq4(int4, int4) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'spt_trap: int4 = int4 was redirected'; END $$;
CREATE FUNCTION spt_trap.eq8(int8, int8) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'spt_trap: int8 = int8 was redirected'; END $$;
CREATE OPERATOR spt_trap.= (LEFTARG = int4, RIGHTARG = int4, FUNCTION = spt_trap.eq4);
CREATE OPERATOR spt_trap.= (LEFTARG = int8, RIGHTARG = int8, FUNCTION = spt_trap.eq8);
CREATE FUNCTION spt_trap.unnest(anyarray) RETURNS SETOF anyelement LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'spt_trap: unnest was redirected'; END $$;

SELECT relay_create_handler('spt_q', 'pull', NULL) > 0 AS created;
SELECT relay_route('spt.a', 'spt_q');

SET search_path = spt_trap, pg_catalog, public;
-- The trap is live for the caller's own statements.
SELECT 1::int4 = 1::int4;
-- A route added now: the next publish reloads the route cache under the trap.
SELECT relay_route('spt.b', 'spt_q');
SELECT relay_publish('spt.a', '{"n": 1}', 'k1') > 0 AS published;
SELECT relay_publish('spt.a', '{"n": 2}', 'k1') > 0 AS published;
SELECT relay_publish('spt.b', '{"n": 3}') > 0 AS published;
SELECT array_length(relay_publish_batch('spt.b', ARRAY['{"n": 4}', '{"n": 5}']::jsonb[],
                                        ARRAY['k2', 'k3']), 1) AS batch;
CREATE TEMP TABLE spt_claimed AS SELECT id, lease, payload FROM relay_claim('spt_q', 10);
SELECT (payload->>'n')::int AS n FROM spt_claimed ORDER BY 1;
SELECT relay_ack((SELECT array_agg(id) FROM spt_claimed), (SELECT array_agg(lease) FROM spt_claimed)) AS acked;
SHOW search_path;

-- An error inside relaybus's statements (relay_ack of a delivery that does not
-- exist fails after its lookup) leaves the caller's search_path as it was:
-- caught in a subtransaction, and aborting the transaction.
DO $$
BEGIN
    PERFORM relay_ack(ARRAY[0]::bigint[]);
EXCEPTION WHEN OTHERS THEN
    RAISE NOTICE 'caught %', SQLSTATE;
END $$;
SHOW search_path;
BEGIN;
SELECT relay_ack(ARRAY[0]::bigint[]);
ROLLBACK;
SHOW search_path;

RESET search_path;
SELECT count(*) AS left_over FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id
 WHERE h.name = 'spt_q';
DROP SCHEMA spt_trap CASCADE;
