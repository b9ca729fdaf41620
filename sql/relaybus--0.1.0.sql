-- relaybus 0.1.0: transactional outbox and event bus
\echo Use "CREATE EXTENSION relaybus" to load this file. \quit

CREATE SCHEMA relay;
COMMENT ON SCHEMA relay IS 'relaybus internals: tables, views and internal functions; not for direct writes';

-- Roles are cluster-wide, so they may exist from another database's install.
DO $roles$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'relay_publisher') THEN
        CREATE ROLE relay_publisher NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'relay_consumer') THEN
        CREATE ROLE relay_consumer NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'relay_admin') THEN
        CREATE ROLE relay_admin NOLOGIN;
    END IF;
END
$roles$;
GRANT relay_publisher, relay_consumer TO relay_admin;

-- Catalog ---------------------------------------------------------------------

CREATE TABLE relay.handlers (
    id          integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        text NOT NULL UNIQUE,
    kind        text NOT NULL CHECK (kind IN ('notify', 'http', 'pull')),
    target      text,
    options     jsonb NOT NULL DEFAULT '{}',   -- as given, validated, without secrets
    secrets     text[],                        -- http signing secrets (whsec_...), admin only
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE relay.routes (
    pattern     text NOT NULL,
    handler_id  integer NOT NULL REFERENCES relay.handlers (id) ON DELETE CASCADE,
    wire_name   text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pattern, handler_id)
);

-- Per ordering key sequence counter. seq is not indexed, so its update is HOT
-- and the free space left by the fillfactor keeps it on the same page.
CREATE TABLE relay.key_seqs (
    key  text PRIMARY KEY,
    seq  bigint NOT NULL
) WITH (fillfactor = 50, autovacuum_vacuum_scale_factor = 0.05);

-- CACHE 1: event ids are drawn after the key's counter row is locked, so
-- within one key id order is commit order.
CREATE SEQUENCE relay.event_id_seq CACHE 1;
CREATE SEQUENCE relay.delivery_id_seq CACHE 1;

-- The outbox. A delivery row is self-contained (it carries the event), so the
-- happy path is exactly one INSERT at publish and one DELETE at completion;
-- leases live in shared memory, never in this table. Columns are ordered for
-- alignment (8-byte, then 4, then 2, then variable length).
CREATE TABLE relay.deliveries (
    id            bigint NOT NULL,
    event_id      bigint NOT NULL,
    seq           bigint,                 -- per key; NULL for unkeyed events
    published_at  timestamptz NOT NULL,
    not_before    timestamptz NOT NULL,   -- ready time: publish time, a delay, or a retry's backoff
    handler_id    integer NOT NULL,
    attempt       integer NOT NULL DEFAULT 0,   -- failed attempts so far
    lane          smallint NOT NULL,
    priority      smallint NOT NULL,
    topic         text NOT NULL,
    wire_topic    text,                   -- the route's wire name, if any
    key           text,
    payload       jsonb NOT NULL,
    headers       jsonb,
    last_error    text,
    CONSTRAINT deliveries_pkey PRIMARY KEY (id)
) WITH (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 50000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_analyze_scale_factor = 0.05
);
-- Claim scan: one range per (handler, priority class), oldest first.
CREATE INDEX deliveries_claim ON relay.deliveries (handler_id, priority, id);
-- Head of a key: the lowest seq of (handler, key).
CREATE INDEX deliveries_key ON relay.deliveries (handler_id, key, seq) WHERE key IS NOT NULL;

CREATE TABLE relay.dead_letters (
    id            bigint PRIMARY KEY,     -- the delivery id (kept on replay)
    event_id      bigint NOT NULL,
    seq           bigint,
    published_at  timestamptz NOT NULL,
    failed_at     timestamptz NOT NULL DEFAULT now(),
    handler_id    integer NOT NULL,
    attempts      integer NOT NULL,
    last_status   integer,                -- HTTP status of the last attempt, if any
    lane          smallint NOT NULL,
    priority      smallint NOT NULL,
    handler       text NOT NULL,          -- name at the time, kept if the handler is dropped
    topic         text NOT NULL,
    wire_topic    text,
    key           text,
    payload       jsonb NOT NULL,
    headers       jsonb,
    last_error    text
);
CREATE INDEX dead_letters_handler ON relay.dead_letters (handler_id, id);

SELECT pg_catalog.pg_extension_config_dump('relay.handlers', '');
SELECT pg_catalog.pg_extension_config_dump('relay.routes', '');
SELECT pg_catalog.pg_extension_config_dump('relay.key_seqs', '');
SELECT pg_catalog.pg_extension_config_dump('relay.deliveries', '');
SELECT pg_catalog.pg_extension_config_dump('relay.dead_letters', '');
SELECT pg_catalog.pg_extension_config_dump('relay.event_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('relay.delivery_id_seq', '');

-- Internal functions (C) --------------------------------------------------------

CREATE FUNCTION relay._validate_handler(name text, kind text, target text, options jsonb)
RETURNS jsonb AS 'MODULE_PATHNAME', 'relay_validate_handler' LANGUAGE C;

CREATE FUNCTION relay._validate_route(pattern text, wire_name text)
RETURNS void AS 'MODULE_PATHNAME', 'relay_validate_route' LANGUAGE C;

CREATE FUNCTION relay._catalog_changed() RETURNS trigger
AS 'MODULE_PATHNAME', 'relay_catalog_changed' LANGUAGE C;

CREATE FUNCTION relay._leases(OUT delivery_id bigint, OUT handler_id integer,
                              OUT lease_until timestamptz, OUT owner_pid integer)
RETURNS SETOF record AS 'MODULE_PATHNAME', 'relay_leases' LANGUAGE C;

CREATE FUNCTION relay._workers(OUT pid integer, OUT worker integer, OUT lanes_held integer,
                               OUT delivered bigint, OUT failed bigint, OUT last_error text,
                               OUT started_at timestamptz, OUT heartbeat timestamptz)
RETURNS SETOF record AS 'MODULE_PATHNAME', 'relay_workers' LANGUAGE C;

CREATE FUNCTION relay._handler_counters(OUT handler_id integer, OUT delivered bigint,
                                        OUT retried bigint, OUT dead_lettered bigint,
                                        OUT latency_p50_ms float8, OUT latency_p99_ms float8,
                                        OUT http_2xx bigint, OUT http_3xx bigint, OUT http_4xx bigint,
                                        OUT http_5xx bigint, OUT http_errors bigint,
                                        OUT breaker_until timestamptz)
RETURNS SETOF record AS 'MODULE_PATHNAME', 'relay_handler_counters' LANGUAGE C;

CREATE FUNCTION relay.lane_of(key text) RETURNS integer
AS 'MODULE_PATHNAME', 'relay_lane_of' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE TRIGGER handlers_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON relay.handlers
    FOR EACH STATEMENT EXECUTE FUNCTION relay._catalog_changed();
CREATE TRIGGER routes_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON relay.routes
    FOR EACH STATEMENT EXECUTE FUNCTION relay._catalog_changed();

-- Publishing (C; run their statements as the extension owner) -------------------

CREATE FUNCTION relay_publish(topic text, payload jsonb, key text DEFAULT NULL,
                              headers jsonb DEFAULT NULL, priority integer DEFAULT 1,
                              not_before timestamptz DEFAULT NULL)
RETURNS bigint AS 'MODULE_PATHNAME', 'relay_publish' LANGUAGE C VOLATILE;

CREATE FUNCTION relay_publish_batch(topic text, payloads jsonb[], keys text[] DEFAULT NULL,
                                    headers jsonb DEFAULT NULL, priority integer DEFAULT 1,
                                    not_before timestamptz DEFAULT NULL)
RETURNS bigint[] AS 'MODULE_PATHNAME', 'relay_publish_batch' LANGUAGE C VOLATILE;

-- Pull consumers (C) -------------------------------------------------------------

CREATE FUNCTION relay_claim(handler text, max integer DEFAULT 100, lease interval DEFAULT NULL,
                            per_key integer DEFAULT 1)
RETURNS TABLE (id bigint, event_id bigint, topic text, key text, seq bigint, payload jsonb,
               headers jsonb, attempt integer, priority integer, published_at timestamptz,
               lease_until timestamptz)
AS 'MODULE_PATHNAME', 'relay_claim' LANGUAGE C VOLATILE;

CREATE FUNCTION relay_ack(ids bigint[]) RETURNS integer
AS 'MODULE_PATHNAME', 'relay_ack' LANGUAGE C VOLATILE;

CREATE FUNCTION relay_nack(id bigint, error text DEFAULT NULL, retry_in interval DEFAULT NULL)
RETURNS text AS 'MODULE_PATHNAME', 'relay_nack' LANGUAGE C VOLATILE;

-- Administration (SQL; SECURITY DEFINER with a fixed search_path) ----------------

CREATE FUNCTION relay_create_handler(name text, kind text, target text DEFAULT NULL,
                                     options jsonb DEFAULT '{}')
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v   jsonb;
    hid integer;
BEGIN
    v := relay._validate_handler(relay_create_handler.name, relay_create_handler.kind,
                                 relay_create_handler.target, relay_create_handler.options);
    IF EXISTS (SELECT 1 FROM relay.handlers h WHERE h.name = relay_create_handler.name) THEN
        RAISE EXCEPTION 'handler "%" already exists', relay_create_handler.name
            USING ERRCODE = 'duplicate_object';
    END IF;
    INSERT INTO relay.handlers (name, kind, target, options, secrets)
    VALUES (relay_create_handler.name, relay_create_handler.kind, v->>'target', v->'options',
            (SELECT array_agg(s) FROM jsonb_array_elements_text(v->'secrets') AS s))
    RETURNING relay.handlers.id INTO hid;
    RETURN hid;
END
$$;

CREATE FUNCTION relay_alter_handler(name text, target text DEFAULT NULL, options jsonb DEFAULT NULL)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    h      relay.handlers;
    merged jsonb;
    v      jsonb;
BEGIN
    IF relay_alter_handler.name IS NULL THEN
        RAISE EXCEPTION 'name must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT * INTO h FROM relay.handlers x WHERE x.name = relay_alter_handler.name FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'handler "%" does not exist', relay_alter_handler.name
            USING ERRCODE = 'undefined_object';
    END IF;
    IF relay_alter_handler.options IS NOT NULL AND jsonb_typeof(relay_alter_handler.options) <> 'object' THEN
        RAISE EXCEPTION 'invalid option: options must be a JSON object'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    merged := h.options;
    IF h.secrets IS NOT NULL THEN
        merged := merged || jsonb_build_object('secret', to_jsonb(h.secrets));
    END IF;
    merged := jsonb_strip_nulls(merged || coalesce(relay_alter_handler.options, '{}'));
    v := relay._validate_handler(h.name, h.kind, coalesce(relay_alter_handler.target, h.target), merged);
    UPDATE relay.handlers x
       SET target = v->>'target', options = v->'options',
           secrets = (SELECT array_agg(s) FROM jsonb_array_elements_text(v->'secrets') AS s),
           updated_at = now()
     WHERE x.id = h.id;
END
$$;

CREATE FUNCTION relay_drop_handler(name text, force boolean DEFAULT false)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    hid integer;
BEGIN
    IF relay_drop_handler.name IS NULL THEN
        RAISE EXCEPTION 'name must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
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

CREATE FUNCTION relay_route(topic text, handler text, wire_name text DEFAULT NULL)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    hid integer;
BEGIN
    IF relay_route.handler IS NULL THEN
        RAISE EXCEPTION 'handler must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM relay._validate_route(relay_route.topic, relay_route.wire_name);
    SELECT x.id INTO hid FROM relay.handlers x WHERE x.name = relay_route.handler;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'handler "%" does not exist', relay_route.handler
            USING ERRCODE = 'undefined_object';
    END IF;
    INSERT INTO relay.routes AS r (pattern, handler_id, wire_name)
    VALUES (relay_route.topic, hid, relay_route.wire_name)
    ON CONFLICT (pattern, handler_id) DO UPDATE SET wire_name = excluded.wire_name;
END
$$;

CREATE FUNCTION relay_unroute(topic text, handler text)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF relay_unroute.topic IS NULL OR relay_unroute.handler IS NULL THEN
        RAISE EXCEPTION 'topic and handler must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM relay.handlers x WHERE x.name = relay_unroute.handler) THEN
        RAISE EXCEPTION 'handler "%" does not exist', relay_unroute.handler
            USING ERRCODE = 'undefined_object';
    END IF;
    DELETE FROM relay.routes r
     USING relay.handlers x
     WHERE r.handler_id = x.id AND x.name = relay_unroute.handler AND r.pattern = relay_unroute.topic;
    RETURN FOUND;
END
$$;

CREATE FUNCTION relay_replay(handler text DEFAULT NULL, ids bigint[] DEFAULT NULL)
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    hid integer;
    n   integer;
BEGIN
    IF relay_replay.handler IS NOT NULL THEN
        SELECT x.id INTO hid FROM relay.handlers x WHERE x.name = relay_replay.handler;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'handler "%" does not exist', relay_replay.handler
                USING ERRCODE = 'undefined_object';
        END IF;
    END IF;
    WITH moved AS (
        DELETE FROM relay.dead_letters dl
         WHERE (hid IS NULL OR dl.handler_id = hid)
           AND (relay_replay.ids IS NULL OR dl.id = ANY (relay_replay.ids))
           AND EXISTS (SELECT 1 FROM relay.handlers x WHERE x.id = dl.handler_id)
        RETURNING dl.*
    )
    INSERT INTO relay.deliveries (id, event_id, seq, published_at, not_before, handler_id, attempt,
                                  lane, priority, topic, wire_topic, key, payload, headers)
    SELECT m.id, m.event_id, m.seq, m.published_at, now(), m.handler_id, 0,
           m.lane, m.priority, m.topic, m.wire_topic, m.key, m.payload, m.headers
      FROM moved m;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- Views ---------------------------------------------------------------------------

CREATE VIEW relay.handler_stats AS
SELECT h.name AS handler,
       h.kind,
       coalesce(d.pending, 0)  AS pending,
       coalesce(d.ready, 0)    AS ready,
       coalesce(d.delayed, 0)  AS delayed,
       coalesce(l.in_flight, 0) AS in_flight,
       coalesce(d.retrying, 0) AS retrying,
       coalesce(x.dead, 0)     AS dead,
       d.oldest_pending_age,
       coalesce(c.delivered, 0) AS delivered,
       coalesce(c.retried, 0)   AS retried,
       c.latency_p50_ms,
       c.latency_p99_ms,
       c.http_2xx, c.http_3xx, c.http_4xx, c.http_5xx, c.http_errors,
       CASE WHEN c.breaker_until > now() THEN c.breaker_until END AS breaker_until
  FROM relay.handlers h
  LEFT JOIN relay._handler_counters() c ON c.handler_id = h.id
  LEFT JOIN LATERAL (
        SELECT count(*) AS pending,
               count(*) FILTER (WHERE dd.not_before <= now()) AS ready,
               count(*) FILTER (WHERE dd.not_before > now()) AS delayed,
               count(*) FILTER (WHERE dd.attempt > 0) AS retrying,
               now() - min(dd.published_at) AS oldest_pending_age
          FROM relay.deliveries dd WHERE dd.handler_id = h.id) d ON true
  LEFT JOIN LATERAL (
        SELECT count(*) AS in_flight FROM relay._leases() ls
         WHERE ls.handler_id = h.id AND ls.lease_until > clock_timestamp()) l ON true
  LEFT JOIN LATERAL (
        SELECT count(*) AS dead FROM relay.dead_letters dl WHERE dl.handler_id = h.id) x ON true;

-- Events that still have a pending delivery. An event is stored in its
-- deliveries (docs/architecture.md: one INSERT and one DELETE per delivery), so
-- this is a view over them rather than a table of its own.
CREATE VIEW relay.events AS
SELECT DISTINCT ON (d.event_id)
       d.event_id AS id, d.topic, d.key, d.seq, d.payload, d.headers, d.published_at,
       count(*) OVER (PARTITION BY d.event_id) AS pending_deliveries
  FROM relay.deliveries d
 ORDER BY d.event_id;

CREATE VIEW relay.workers AS
SELECT w.pid, current_database() AS database, w.worker, w.lanes_held, w.delivered, w.failed,
       w.last_error, w.started_at, w.heartbeat
  FROM relay._workers() w;

-- A NOTIFY too large to send inline carries "ref": true; the consumer fetches
-- the payload here and acknowledges with relay_ack.
CREATE FUNCTION relay_payload(id bigint) RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT d.payload FROM relay.deliveries d WHERE d.id = relay_payload.id
$$;

-- Privileges ----------------------------------------------------------------------

REVOKE ALL ON ALL TABLES IN SCHEMA relay FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA relay FROM PUBLIC;
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA relay FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION relay_publish(text, jsonb, text, jsonb, integer, timestamptz),
                           relay_publish_batch(text, jsonb[], text[], jsonb, integer, timestamptz),
                           relay_claim(text, integer, interval, integer),
                           relay_ack(bigint[]),
                           relay_nack(bigint, text, interval),
                           relay_payload(bigint),
                           relay_create_handler(text, text, text, jsonb),
                           relay_alter_handler(text, text, jsonb),
                           relay_drop_handler(text, boolean),
                           relay_route(text, text, text),
                           relay_unroute(text, text),
                           relay_replay(text, bigint[]) FROM PUBLIC;

GRANT EXECUTE ON FUNCTION relay_publish(text, jsonb, text, jsonb, integer, timestamptz),
                          relay_publish_batch(text, jsonb[], text[], jsonb, integer, timestamptz)
    TO relay_publisher;
GRANT USAGE ON SCHEMA relay TO relay_consumer, relay_admin;
GRANT EXECUTE ON FUNCTION relay_claim(text, integer, interval, integer),
                          relay_ack(bigint[]),
                          relay_nack(bigint, text, interval),
                          relay_payload(bigint),
                          relay._leases(),
                          relay._handler_counters(),
                          relay._workers()
    TO relay_consumer;
GRANT SELECT ON relay.handler_stats, relay.workers TO relay_consumer;
GRANT EXECUTE ON FUNCTION relay_create_handler(text, text, text, jsonb),
                          relay_alter_handler(text, text, jsonb),
                          relay_drop_handler(text, boolean),
                          relay_route(text, text, text),
                          relay_unroute(text, text),
                          relay_replay(text, bigint[]),
                          relay.lane_of(text)
    TO relay_admin;
GRANT SELECT ON ALL TABLES IN SCHEMA relay TO relay_admin;
