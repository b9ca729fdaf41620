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

-- relay_drop_handler serializes with publishers: it first locks relay.deliveries
-- against writers (SHARE ROW EXCLUSIVE: it conflicts with a publisher's ROW
-- EXCLUSIVE and with another drop), so it waits for every publish in progress
-- to commit and then deletes their deliveries too; a publish that starts
-- meanwhile waits for the drop and reads its routes after it (relay_publish
-- takes its lock before reading the routes). No delivery of a dropped handler
-- is left behind.
CREATE OR REPLACE FUNCTION relay_drop_handler(name text, force boolean DEFAULT false)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    hid integer;
BEGIN
    IF relay_drop_handler.name IS NULL THEN
        RAISE EXCEPTION 'name must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    LOCK TABLE relay.deliveries IN SHARE ROW EXCLUSIVE MODE;
    SELECT x.id INTO hid FROM relay.handlers x WHERE x.name = relay_drop_handler.name FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'handler "%" does not exist', relay_drop_handler.name
            USING ERRCODE = 'undefined_object';
    END IF;
    IF EXISTS (SELECT 1 FROM relay.deliveries d WHERE d.handler_id = hid) THEN
        IF NOT coalesce(relay_drop_handler.force, false) THEN
            RAISE EXCEPTION 'handler "%" has pending deliveries', relay_drop_handler.name
                USING ERRCODE = 'object_in_use',
                      HINT = 'Use relay_drop_handler(name, force => true) to delete them.';
        END IF;
        DELETE FROM relay.deliveries d WHERE d.handler_id = hid;
    END IF;
    DELETE FROM relay.handlers x WHERE x.id = hid;
END
$$;
