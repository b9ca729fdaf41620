-- relaybus: the current definition of every object of the extension. The
-- Makefile copies this file to sql/relaybus--<default_version>.sql, which
-- CREATE EXTENSION runs; sql/relaybus--OLD--NEW.sql scripts hold the deltas
-- that bring an older install to the same catalog (test/integration/
-- catalog_parity.sh compares the two). Change an object here and in a new
-- upgrade script together (docs/operations.md, "Changing the SQL").
-- @managed begin preamble
\echo Use "CREATE EXTENSION relaybus" to load this file. \quit
-- @managed end preamble

CREATE SCHEMA relay;
COMMENT ON SCHEMA relay IS 'relaybus internals: tables, views and internal functions; not for direct writes';

-- Roles are cluster-wide, so they may exist from another database's install.
-- relay_monitor reads the stats views and nothing else: no table, no payload,
-- no secret, no claim or ack.
-- @managed begin roles
DO $roles$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['relay_publisher', 'relay_consumer', 'relay_admin', 'relay_monitor'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r) THEN
            EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', r);
        END IF;
    END LOOP;
END
$roles$;
GRANT relay_publisher, relay_consumer TO relay_admin;
GRANT relay_monitor TO relay_admin;
-- @managed end roles

-- Catalog ---------------------------------------------------------------------

-- kafka handlers: target kafka://host:port[,host:port...]/topic, delivered by
-- the dispatchers through librdkafka (docs/kafka.md). relay._validate_handler
-- (C) checks target and options. Their SASL/TLS credentials live in
-- options->'producer', readable like the webhook secrets only by relay_admin
-- (relay.handlers is granted to nobody else; the views do not show options).
-- Paused handlers: publishing continues, the dispatchers and relay_claim skip
-- them (read by the library's catalog cache).
CREATE TABLE relay.handlers (
    id          integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        text NOT NULL UNIQUE,
    kind        text NOT NULL,
    target      text,
    options     jsonb NOT NULL DEFAULT '{}',   -- as given, validated, without secrets
    secrets     text[],                        -- http signing secrets (whsec_...), admin only
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    paused      boolean NOT NULL DEFAULT false,
    CONSTRAINT handlers_kind_check CHECK (kind IN ('notify', 'http', 'pull', 'kafka'))
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
    last_error    text,
    -- Why a delivery is a dead letter: it failed (max_attempts, a permanent
    -- error) or an admin cancelled it (relay_cancel).
    reason        text NOT NULL DEFAULT 'failed'
        CONSTRAINT dead_letters_reason CHECK (reason IN ('failed', 'cancelled'))
);
CREATE INDEX dead_letters_handler ON relay.dead_letters (handler_id, id);

-- Publisher idempotency (docs/sql-api.md, relay_publish's dedupe_key): a
-- dedupe key names the first event published with it until expires_at
-- (relaybus.dedupe_window). The library writes and reads it (dedupe.hpp); the
-- dispatchers remove expired rows.
CREATE TABLE relay.dedupe (
    key         text PRIMARY KEY,
    event_id    bigint NOT NULL,
    expires_at  timestamptz NOT NULL
);
CREATE INDEX dedupe_expires ON relay.dedupe (expires_at);

-- What each relaybus-agent reports of its work, every few seconds
-- (docs/managed.md, "The agents' counters in the views"): the managed
-- edition's monitoring functions read it. The extension's workers keep their
-- counters in shared memory, and no agent serves a database with the
-- extension, so there it stays empty. One row per agent and handler (handler
-- '' is the agent's own row), counters since that agent started; a row past
-- stale_after (an agent that stopped reporting) is left out of the views.
-- UNLOGGED: a crash forgets it, as a restart forgets the workers' counters.
CREATE UNLOGGED TABLE relay.agent_reports (
    agent        text NOT NULL,
    handler      text NOT NULL,
    backend_pid  integer NOT NULL,
    started_at   timestamptz NOT NULL,
    reported_at  timestamptz NOT NULL,
    stale_after  timestamptz NOT NULL,
    counters     jsonb NOT NULL,
    PRIMARY KEY (agent, handler)
);

-- @managed begin config_dump
SELECT pg_catalog.pg_extension_config_dump('relay.handlers', '');
SELECT pg_catalog.pg_extension_config_dump('relay.routes', '');
SELECT pg_catalog.pg_extension_config_dump('relay.key_seqs', '');
SELECT pg_catalog.pg_extension_config_dump('relay.deliveries', '');
SELECT pg_catalog.pg_extension_config_dump('relay.dead_letters', '');
SELECT pg_catalog.pg_extension_config_dump('relay.event_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('relay.delivery_id_seq', '');
-- The identity sequence of relay.handlers holds user state too: without it a
-- restored database hands out handler ids from 1 again (docs/operations.md).
SELECT pg_catalog.pg_extension_config_dump('relay.handlers_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('relay.dedupe', '');
-- @managed end config_dump

-- @managed begin internal
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

CREATE FUNCTION relay._handler_totals(OUT handler_id integer, OUT published bigint,
                                      OUT latency_sum_seconds float8, OUT pending bigint)
RETURNS SETOF record AS 'MODULE_PATHNAME', 'relay_handler_totals' LANGUAGE C;

-- The pending counts live in shared memory: counted once per server start (and
-- per installation) by a dispatcher under a lock no writer holds, then kept
-- by every writer at commit (src/pg/pending_counter.hpp).
CREATE FUNCTION relay._pending_counted() RETURNS boolean
AS 'MODULE_PATHNAME', 'relay_pending_counted' LANGUAGE C STABLE;
-- Counts again (admin; after rows were written by other means, e.g. pg_restore).
CREATE FUNCTION relay._recount_pending() RETURNS void
AS 'MODULE_PATHNAME', 'relay_recount_pending' LANGUAGE C VOLATILE;
-- For SQL functions that add or remove deliveries (relay_replay; any new one
-- must call it): the change applies at commit.
CREATE FUNCTION relay._count_pending(handler_id integer, delta bigint) RETURNS void
AS 'MODULE_PATHNAME', 'relay_count_pending' LANGUAGE C VOLATILE;

CREATE FUNCTION relay._handler_latency_buckets(OUT handler_id integer, OUT le float8, OUT count bigint)
RETURNS SETOF record AS 'MODULE_PATHNAME', 'relay_handler_latency_buckets' LANGUAGE C;

-- Attempts that went out (http, kafka) since server start: their send times
-- and the kafka messages acknowledged after a gap of their key.
CREATE FUNCTION relay._handler_sends(OUT handler_id integer, OUT sends bigint,
                                     OUT send_p50_ms float8, OUT send_p99_ms float8,
                                     OUT send_sum_seconds float8, OUT delivered_after_gap bigint)
RETURNS SETOF record AS 'MODULE_PATHNAME', 'relay_handler_sends' LANGUAGE C;

-- Handlers with rate or max_concurrency: deliveries that waited for a permit
-- since server start, and whether one was refused within the last second.
CREATE FUNCTION relay._handler_limits(OUT handler_id integer, OUT held_back bigint, OUT limited boolean)
RETURNS SETOF record AS 'MODULE_PATHNAME', 'relay_handler_limits' LANGUAGE C;

-- Malformed traceparent and tracestate values that publishes left out, in
-- every database since the server started (docs/tracing.md).
CREATE FUNCTION relay._trace_context_ignored() RETURNS bigint
AS 'MODULE_PATHNAME', 'relay_trace_context_ignored' LANGUAGE C VOLATILE;

-- The publish time of a handler's oldest pending delivery: the heads of its
-- four priority classes in the claim index (a constant cost).
CREATE FUNCTION relay._oldest_pending(handler_id integer) RETURNS timestamptz
AS 'MODULE_PATHNAME', 'relay_oldest_pending' LANGUAGE C STABLE STRICT;

CREATE TRIGGER handlers_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON relay.handlers
    FOR EACH STATEMENT EXECUTE FUNCTION relay._catalog_changed();
CREATE TRIGGER routes_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON relay.routes
    FOR EACH STATEMENT EXECUTE FUNCTION relay._catalog_changed();
-- @managed end internal

-- @managed begin publishing
-- Publishing (C; run their statements as the extension owner) -------------------

CREATE FUNCTION relay_publish(topic text, payload jsonb, key text DEFAULT NULL,
                              headers jsonb DEFAULT NULL, priority integer DEFAULT 1,
                              not_before timestamptz DEFAULT NULL, dedupe_key text DEFAULT NULL)
RETURNS bigint AS 'MODULE_PATHNAME', 'relay_publish_v2' LANGUAGE C VOLATILE;

CREATE FUNCTION relay_publish_batch(topic text, payloads jsonb[], keys text[] DEFAULT NULL,
                                    headers jsonb DEFAULT NULL, priority integer DEFAULT 1,
                                    not_before timestamptz DEFAULT NULL, dedupe_keys text[] DEFAULT NULL)
RETURNS bigint[] AS 'MODULE_PATHNAME', 'relay_publish_batch_v2' LANGUAGE C VOLATILE;
-- @managed end publishing

-- @managed begin pull
-- Pull consumers (C) -------------------------------------------------------------

-- Leases are receipts (docs/consumers.md): relay_claim returns each lease's
-- token, and relay_ack / relay_nack / relay_extend name it.
CREATE FUNCTION relay_claim(handler text, max integer DEFAULT 100, lease interval DEFAULT NULL,
                            per_key integer DEFAULT 1)
RETURNS TABLE (id bigint, event_id bigint, topic text, key text, seq bigint, payload jsonb,
               headers jsonb, attempt integer, priority integer, published_at timestamptz,
               lease_until timestamptz, lease uuid, traceparent text)
AS 'MODULE_PATHNAME', 'relay_claim' LANGUAGE C VOLATILE;

CREATE FUNCTION relay_ack(ids bigint[], leases uuid[] DEFAULT NULL) RETURNS integer
AS 'MODULE_PATHNAME', 'relay_ack_v2' LANGUAGE C VOLATILE;

CREATE FUNCTION relay_nack(id bigint, error text DEFAULT NULL, retry_in interval DEFAULT NULL,
                           lease uuid DEFAULT NULL)
RETURNS text AS 'MODULE_PATHNAME', 'relay_nack_v2' LANGUAGE C VOLATILE;

CREATE FUNCTION relay_extend(id bigint, lease uuid, extend_by interval DEFAULT NULL)
RETURNS timestamptz AS 'MODULE_PATHNAME', 'relay_extend' LANGUAGE C VOLATILE;
-- @managed end pull
-- @managed begin agent
-- @managed end agent

-- Administration (SQL; SECURITY DEFINER with a fixed search_path) ----------------

-- A handler id is never used twice, even after a restore of a dump that lacks
-- the sequence (0.1.0's): the id drawn is above every id a handler or a dead
-- letter has used, so no dead letter of a dropped handler reaches a new one.
CREATE FUNCTION relay_create_handler(name text, kind text, target text DEFAULT NULL,
                                     options jsonb DEFAULT '{}')
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v    jsonb;
    hid  bigint;
    used bigint;
    seq  text := pg_get_serial_sequence('relay.handlers', 'id');
BEGIN
    v := relay._validate_handler(relay_create_handler.name, relay_create_handler.kind,
                                 relay_create_handler.target, relay_create_handler.options);
    IF EXISTS (SELECT 1 FROM relay.handlers h WHERE h.name = relay_create_handler.name) THEN
        RAISE EXCEPTION 'handler "%" already exists', relay_create_handler.name
            USING ERRCODE = 'duplicate_object';
    END IF;
    hid := nextval(seq);
    used := greatest((SELECT max(h.id) FROM relay.handlers h),
                     (SELECT max(dl.handler_id) FROM relay.dead_letters dl));
    IF hid <= used THEN
        PERFORM setval(seq, used);
        hid := nextval(seq);
    END IF;
    INSERT INTO relay.handlers (id, name, kind, target, options, secrets) OVERRIDING SYSTEM VALUE
    VALUES (hid, relay_create_handler.name, relay_create_handler.kind, v->>'target', v->'options',
            (SELECT array_agg(s) FROM jsonb_array_elements_text(v->'secrets') AS s));
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

-- relay_drop_handler serializes with publishers: it first locks relay.deliveries
-- against writers (SHARE ROW EXCLUSIVE: it conflicts with a publisher's ROW
-- EXCLUSIVE and with another drop), so it waits for every publish in progress
-- to commit and then deletes their deliveries too; a publish that starts
-- meanwhile waits for the drop and reads its routes after it (relay_publish
-- takes its lock before reading the routes). No delivery of a dropped handler
-- is left behind.
CREATE FUNCTION relay_drop_handler(name text, force boolean DEFAULT false)
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

-- relay_replay puts dead letters back: the pending counts follow (at commit).
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
    ), inserted AS (
        INSERT INTO relay.deliveries (id, event_id, seq, published_at, not_before, handler_id, attempt,
                                      lane, priority, topic, wire_topic, key, payload, headers)
        SELECT m.id, m.event_id, m.seq, m.published_at, now(), m.handler_id, 0,
               m.lane, m.priority, m.topic, m.wire_topic, m.key, m.payload, m.headers
          FROM moved m
        RETURNING handler_id
    )
    SELECT coalesce(sum(c.k), 0) INTO n
      FROM (SELECT i.handler_id, count(*) AS k FROM inserted i GROUP BY i.handler_id) c,
           LATERAL relay._count_pending(c.handler_id, c.k) AS counted;
    RETURN n;
END
$$;

-- Pausing and resuming share one body: set the flag, or say the handler is unknown.
CREATE FUNCTION relay._set_paused(name text, paused boolean) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF _set_paused.name IS NULL THEN
        RAISE EXCEPTION 'name must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    UPDATE relay.handlers x SET paused = _set_paused.paused, updated_at = now()
     WHERE x.name = _set_paused.name AND x.paused <> _set_paused.paused;
    IF NOT FOUND AND NOT EXISTS (SELECT 1 FROM relay.handlers x WHERE x.name = _set_paused.name) THEN
        RAISE EXCEPTION 'handler "%" does not exist', _set_paused.name
            USING ERRCODE = 'undefined_object';
    END IF;
END
$$;

CREATE FUNCTION relay_pause_handler(name text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT relay._set_paused(relay_pause_handler.name, true)
$$;

CREATE FUNCTION relay_resume_handler(name text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT relay._set_paused(relay_resume_handler.name, false)
$$;

-- Cancels pending deliveries: each moves to relay.dead_letters with reason
-- 'cancelled' (replayable like any dead letter). A leased one (in flight with a
-- consumer or a dispatcher) is refused with 55P03 and nothing is cancelled: its
-- holder could not complete it otherwise. Ids that are not pending are skipped.
CREATE FUNCTION relay_cancel(ids bigint[]) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    leased bigint[];
    n      integer;
BEGIN
    IF relay_cancel.ids IS NULL THEN
        RAISE EXCEPTION 'ids must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    WITH d AS (
        DELETE FROM relay.deliveries d WHERE d.id = ANY (relay_cancel.ids) RETURNING d.*
    ), moved AS (
        INSERT INTO relay.dead_letters (id, event_id, seq, published_at, handler_id, attempts, lane,
                                        priority, handler, topic, wire_topic, key, payload, headers,
                                        last_error, reason)
        SELECT d.id, d.event_id, d.seq, d.published_at, d.handler_id, d.attempt, d.lane, d.priority,
               coalesce(h.name, ''), d.topic, d.wire_topic, d.key, d.payload, d.headers,
               'cancelled by ' || session_user, 'cancelled'
          FROM d LEFT JOIN relay.handlers h ON h.id = d.handler_id
        RETURNING handler_id
    )
    -- The pending counts follow at commit (relay._count_pending, monitoring below).
    SELECT coalesce(sum(c.k), 0) INTO n
      FROM (SELECT m.handler_id, count(*) AS k FROM moved m GROUP BY m.handler_id) c,
           LATERAL relay._count_pending(c.handler_id, -c.k) AS counted;
    -- Checked after the rows are deleted: a claim that leases one of them from
    -- now on finds it gone when it fetches the rows (docs/consumers.md).
    SELECT array_agg(l.delivery_id ORDER BY l.delivery_id) INTO leased
      FROM relay._leases() l
     WHERE l.delivery_id = ANY (relay_cancel.ids) AND l.lease_until > clock_timestamp();
    IF leased IS NOT NULL THEN
        RAISE EXCEPTION 'deliveries % are leased', leased
            USING ERRCODE = 'lock_not_available',
                  DETAIL = 'A consumer or a dispatcher holds them; nothing was cancelled.',
                  HINT = 'Pause the handler (relay_pause_handler) and retry once the leases ended.';
    END IF;
    RETURN n;
END
$$;

-- Deletes dead letters of one handler (by its name as recorded, so a dropped
-- handler's too) and/or older than an interval; both NULL: all of them.
CREATE FUNCTION relay_purge_dead_letters(handler text DEFAULT NULL, older_than interval DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n bigint;
BEGIN
    IF relay_purge_dead_letters.older_than < interval '0' THEN
        RAISE EXCEPTION 'older_than must not be negative' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF relay_purge_dead_letters.handler IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM relay.handlers x WHERE x.name = relay_purge_dead_letters.handler)
       AND NOT EXISTS (SELECT 1 FROM relay.dead_letters dl WHERE dl.handler = relay_purge_dead_letters.handler) THEN
        RAISE EXCEPTION 'handler "%" does not exist and has no dead letters', relay_purge_dead_letters.handler
            USING ERRCODE = 'undefined_object';
    END IF;
    DELETE FROM relay.dead_letters dl
     WHERE (relay_purge_dead_letters.handler IS NULL OR dl.handler = relay_purge_dead_letters.handler)
       AND (relay_purge_dead_letters.older_than IS NULL
            OR dl.failed_at < now() - relay_purge_dead_letters.older_than);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- Removes the counters of keys with nothing pending and nothing dead. Each key
-- is locked (FOR UPDATE, as a publisher's counter bump does) and checked again
-- with a snapshot taken after the lock: a publish of that key in progress
-- commits first and keeps its counter, and a publish after the removal waits
-- for it and starts the key at seq 1 with nothing of the key left to follow.
CREATE FUNCTION relay_prune_key_seqs() RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    k text;
    n bigint := 0;
BEGIN
    FOR k IN SELECT s.key FROM relay.key_seqs s
              WHERE NOT EXISTS (SELECT 1 FROM relay.deliveries d WHERE d.key = s.key)
                AND NOT EXISTS (SELECT 1 FROM relay.dead_letters dl WHERE dl.key = s.key)
    LOOP
        PERFORM 1 FROM relay.key_seqs s WHERE s.key = k FOR UPDATE;
        DELETE FROM relay.key_seqs s
         WHERE s.key = k
           AND NOT EXISTS (SELECT 1 FROM relay.deliveries d WHERE d.key = k)
           AND NOT EXISTS (SELECT 1 FROM relay.dead_letters dl WHERE dl.key = k);
        n := n + CASE WHEN FOUND THEN 1 ELSE 0 END;
    END LOOP;
    RETURN n;
END
$$;

-- Views ---------------------------------------------------------------------------

-- relay.handler_stats is for humans: its counts scan relay.deliveries. Columns
-- only ever join at the end (CREATE OR REPLACE VIEW in an upgrade).
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
       CASE WHEN c.breaker_until > now() THEN c.breaker_until END AS breaker_until,
       h.paused,
       current_database() AS database,
       s.send_p50_ms,
       s.send_p99_ms,
       coalesce(s.delivered_after_gap, 0) AS delivered_after_gap,
       coalesce(lim.held_back, 0) AS held_back,
       coalesce(lim.limited, false) AS limited
  FROM relay.handlers h
  LEFT JOIN relay._handler_counters() c ON c.handler_id = h.id
  LEFT JOIN relay._handler_sends() s ON s.handler_id = h.id
  LEFT JOIN relay._handler_limits() lim ON lim.handler_id = h.id
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

-- For scrapers: shared-memory counters (monotonic since server start) and, per
-- handler, four index probes for the oldest pending delivery (the head of each
-- priority class, relay._oldest_pending): the cost does not grow with the backlog.
CREATE VIEW relay.handler_metrics AS
SELECT current_database() AS database,
       h.name AS handler,
       h.kind,
       coalesce(t.published, 0)     AS published,
       coalesce(c.delivered, 0)     AS delivered,
       coalesce(c.retried, 0)       AS retried,
       coalesce(c.dead_lettered, 0) AS dead_lettered,
       coalesce(l.in_flight, 0)     AS in_flight,
       CASE WHEN counted.ok THEN coalesce(t.pending, 0) END AS pending,
       coalesce(extract(epoch FROM now() - relay._oldest_pending(h.id))::float8, 0) AS oldest_pending_seconds,
       coalesce(t.latency_sum_seconds, 0) AS latency_sum_seconds,
       coalesce(c.http_2xx, 0) AS http_2xx, coalesce(c.http_3xx, 0) AS http_3xx,
       coalesce(c.http_4xx, 0) AS http_4xx, coalesce(c.http_5xx, 0) AS http_5xx,
       coalesce(c.http_errors, 0) AS http_errors,
       coalesce(c.breaker_until > now(), false) AS breaker_open,
       coalesce(s.sends, 0) AS sends,
       coalesce(s.send_sum_seconds, 0) AS send_sum_seconds,
       coalesce(s.delivered_after_gap, 0) AS delivered_after_gap,
       coalesce(lim.held_back, 0) AS held_back,
       coalesce(lim.limited, false) AS limited
  FROM relay.handlers h
  CROSS JOIN relay._pending_counted() AS counted(ok)
  LEFT JOIN relay._handler_counters() c ON c.handler_id = h.id
  LEFT JOIN relay._handler_sends() s ON s.handler_id = h.id
  LEFT JOIN relay._handler_limits() lim ON lim.handler_id = h.id
  LEFT JOIN relay._handler_totals() t ON t.handler_id = h.id
  LEFT JOIN (SELECT ls.handler_id, count(*) AS in_flight FROM relay._leases() ls
              WHERE ls.lease_until > clock_timestamp() GROUP BY ls.handler_id) l ON l.handler_id = h.id;

-- Publish-to-completion latency as a cumulative histogram (Prometheus
-- histogram_quantile): le in seconds, the last bucket +Infinity.
CREATE VIEW relay.handler_latency_buckets AS
SELECT current_database() AS database, h.name AS handler, b.le, b.count
  FROM relay.handlers h
  JOIN relay._handler_latency_buckets() b ON b.handler_id = h.id;

-- A NOTIFY too large to send inline carries "ref": true; the consumer fetches
-- the payload here and acknowledges with relay_ack.
CREATE FUNCTION relay_payload(id bigint) RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT d.payload FROM relay.deliveries d WHERE d.id = relay_payload.id
$$;

-- Privileges ----------------------------------------------------------------------
-- Nothing is granted to PUBLIC; each role gets what it needs by name.

REVOKE ALL ON ALL TABLES IN SCHEMA relay FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA relay FROM PUBLIC;
-- Every function of the extension, in relay and beside it, starts without
-- EXECUTE for PUBLIC, so that a new one cannot be left out.
-- @managed begin revoke
DO $revoke$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT d.objid FROM pg_catalog.pg_depend d
              WHERE d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass AND d.deptype = 'e'
                AND d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass
                AND d.refobjid = (SELECT e.oid FROM pg_catalog.pg_extension e WHERE e.extname = 'relaybus')
    LOOP
        EXECUTE pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$revoke$;
-- @managed end revoke

GRANT EXECUTE ON FUNCTION relay_publish(text, jsonb, text, jsonb, integer, timestamptz, text),
                          relay_publish_batch(text, jsonb[], text[], jsonb, integer, timestamptz, text[])
    TO relay_publisher;

GRANT USAGE ON SCHEMA relay TO relay_consumer, relay_admin, relay_monitor;
GRANT EXECUTE ON FUNCTION relay_claim(text, integer, interval, integer),
                          relay_ack(bigint[], uuid[]),
                          relay_nack(bigint, text, interval, uuid),
                          relay_extend(bigint, uuid, interval),
                          relay_payload(bigint)
    TO relay_consumer;

-- The stats views call these as the reader: they return counters, delivery
-- ids and lease times, never payloads.
GRANT EXECUTE ON FUNCTION relay._leases(), relay._handler_counters(), relay._workers() TO relay_consumer;
GRANT EXECUTE ON FUNCTION relay._handler_counters(), relay._handler_totals(), relay._handler_sends(),
                          relay._handler_limits(), relay._trace_context_ignored(),
                          relay._handler_latency_buckets(), relay._oldest_pending(integer),
                          relay._pending_counted(), relay._leases(), relay._workers()
    TO relay_monitor, relay_consumer;
GRANT SELECT ON relay.handler_stats, relay.workers TO relay_consumer;

GRANT EXECUTE ON FUNCTION relay_create_handler(text, text, text, jsonb),
                          relay_alter_handler(text, text, jsonb),
                          relay_drop_handler(text, boolean),
                          relay_route(text, text, text),
                          relay_unroute(text, text),
                          relay_replay(text, bigint[]),
                          relay_pause_handler(text),
                          relay_resume_handler(text),
                          relay_cancel(bigint[]),
                          relay_purge_dead_letters(text, interval),
                          relay_prune_key_seqs(),
                          relay.lane_of(text),
                          relay._recount_pending()
    TO relay_admin;
-- relay_admin reads every table (the secrets of relay.handlers included) but
-- not the scrapers' views, which are relay_monitor's.
GRANT SELECT ON relay.handlers, relay.routes, relay.key_seqs, relay.deliveries, relay.dead_letters,
                relay.dedupe, relay.handler_stats, relay.events, relay.workers
    TO relay_admin;
GRANT SELECT ON relay.handler_stats, relay.handler_metrics, relay.handler_latency_buckets, relay.workers
    TO relay_monitor, relay_consumer;
