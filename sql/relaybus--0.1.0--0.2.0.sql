-- relaybus 0.1.0 -> 0.2.0. CREATE EXTENSION runs relaybus--0.1.0.sql and then
-- this script, so every install exercises the upgrade path (docs/operations.md).
\echo Use "ALTER EXTENSION relaybus UPDATE TO '0.2.0'" to load this file. \quit

-- Leases are receipts (docs/consumers.md): relay_claim returns each lease's
-- token, and relay_ack / relay_nack / relay_extend name it. The return type of
-- relay_claim and the arguments of relay_ack change, so they are dropped and
-- created again (no object depends on them); the grants follow.
DROP FUNCTION relay_claim(text, integer, interval, integer);
CREATE FUNCTION relay_claim(handler text, max integer DEFAULT 100, lease interval DEFAULT NULL,
                            per_key integer DEFAULT 1)
RETURNS TABLE (id bigint, event_id bigint, topic text, key text, seq bigint, payload jsonb,
               headers jsonb, attempt integer, priority integer, published_at timestamptz,
               lease_until timestamptz, lease uuid)
AS 'MODULE_PATHNAME', 'relay_claim' LANGUAGE C VOLATILE;

DROP FUNCTION relay_ack(bigint[]);
CREATE FUNCTION relay_ack(ids bigint[], leases uuid[] DEFAULT NULL) RETURNS integer
AS 'MODULE_PATHNAME', 'relay_ack' LANGUAGE C VOLATILE;

DROP FUNCTION relay_nack(bigint, text, interval);
CREATE FUNCTION relay_nack(id bigint, error text DEFAULT NULL, retry_in interval DEFAULT NULL,
                           lease uuid DEFAULT NULL)
RETURNS text AS 'MODULE_PATHNAME', 'relay_nack' LANGUAGE C VOLATILE;

CREATE FUNCTION relay_extend(id bigint, lease uuid, extend_by interval DEFAULT NULL)
RETURNS timestamptz AS 'MODULE_PATHNAME', 'relay_extend' LANGUAGE C VOLATILE;

REVOKE EXECUTE ON FUNCTION relay_claim(text, integer, interval, integer),
                           relay_ack(bigint[], uuid[]),
                           relay_nack(bigint, text, interval, uuid),
                           relay_extend(bigint, uuid, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION relay_claim(text, integer, interval, integer),
                          relay_ack(bigint[], uuid[]),
                          relay_nack(bigint, text, interval, uuid),
                          relay_extend(bigint, uuid, interval)
    TO relay_consumer;
