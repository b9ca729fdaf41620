-- relaybus-agent (docs/managed.md, "relaybus-agent") ----------------------------
-- What the background workers do for notify, http and kafka handlers, done by an
-- outside process: these functions are its only way in. Each is SECURITY
-- DEFINER and executable by relay_agent alone, so the agent's login role needs
-- no table privilege; relay_claim keeps refusing http and fire-and-forget
-- notify handlers to consumers.

-- relay_agent: NOLOGIN, granted to the role the agent logs in with. Created
-- like the other roles (roles.sql): by an installer with CREATEROLE, else by
-- an administrator beforehand.
DO $agent_role$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'relay_agent') THEN
        IF NOT (SELECT rolcreaterole OR rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
            RAISE EXCEPTION 'roles {relay_agent} do not exist and % may not create them', current_user
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'Have a role with CREATEROLE create it (CREATE ROLE relay_agent NOLOGIN;), then install again.';
        END IF;
        CREATE ROLE relay_agent NOLOGIN;
    END IF;
END
$agent_role$;

-- The handlers an agent delivers, secrets included (relay.handlers is
-- relay_admin's alone). message_id_prefix: the extension's webhook-id prefix
-- (docs/webhooks.md), so a delivery keeps its webhook-id across editions.
CREATE FUNCTION relay._agent_handlers(OUT id integer, OUT name text, OUT kind text, OUT target text,
                                      OUT options jsonb, OUT secrets text[], OUT paused boolean,
                                      OUT message_id_prefix text)
RETURNS SETOF record LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT h.id, h.name, h.kind, h.target, h.options, coalesce(h.secrets, '{}'), h.paused,
           'msg_' || (SELECT c.system_identifier FROM pg_control_system() c) || '_'
                  || (SELECT d.oid FROM pg_database d WHERE d.datname = current_database()) || '_'
      FROM relay.handlers h
     WHERE h.kind IN ('notify', 'http', 'kafka')
     ORDER BY h.id
$$;

-- relay._claim for a handler the agent delivers (by id: a renamed handler is
-- the same one). Nothing for a paused, dropped or other handler. lease_ms is
-- the agent's (an http or kafka lease covers the send's timeout).
CREATE FUNCTION relay._agent_claim(handler_id integer, max_rows integer, lease_ms bigint, per_key integer)
RETURNS TABLE (id bigint, event_id bigint, topic text, key text, seq bigint, payload text,
               headers text, attempt integer, published_ms bigint, lease uuid)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    h relay.handlers;
BEGIN
    PERFORM relay._refuse_in_recovery('relay._agent_claim');
    PERFORM relay._check_between('max', max_rows, 1, 10000, NULL);
    PERFORM relay._check_between('per_key', per_key, 1, 10000, NULL);
    PERFORM relay._lease_ms('lease', lease_ms * interval '1 millisecond');
    SELECT * INTO h FROM relay.handlers x WHERE x.id = _agent_claim.handler_id;
    IF NOT FOUND OR h.paused OR h.kind NOT IN ('notify', 'http', 'kafka') THEN
        RETURN;
    END IF;
    RETURN QUERY
        SELECT c.id, c.event_id, c.topic, c.key, c.seq, c.payload::text, c.headers::text, c.attempt,
               (extract(epoch FROM c.published_at) * 1000)::bigint, c.lease
          FROM relay._claim_handler(h, max_rows, lease_ms, per_key) c;
END
$$;

-- One iteration of a notify handler, as the extension's dispatcher does it
-- (docs/architecture.md, "One iteration"), in the caller's transaction: claim,
-- pg_notify each delivery with the extension's payload, delete the
-- fire-and-forget ones. The NOTIFYs and the deletions become visible at the
-- same commit. Ack mode, and a payload longer than payload_limit (sent by
-- reference), keep their lease and carry it ("lease") for relay_ack. Returns
-- how many deliveries were sent. One statement after the claim; planner
-- settings and generic plans as relay._claim_handler's, for the same reasons.
-- With leased_id: instead of a claim, the one delivery the agent leased itself
-- (relay._agent_claim) under leased_token. The agent sends a suspect of poison
-- that way, alone, after an iteration failed for a delivery's data: the
-- statement rolls back whole, and only a lease it holds tells the agent which
-- delivery to charge (docs/managed.md, "Poison isolation").
CREATE FUNCTION relay._agent_notify(handler_id integer, max_rows integer, payload_limit integer,
                                    leased_id bigint DEFAULT NULL, leased_token uuid DEFAULT NULL)
RETURNS integer LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off SET jit = off
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    h       relay.handlers;
    ack     boolean;
    inline  boolean;
    n       integer;
    fired   bigint[];
BEGIN
    PERFORM relay._refuse_in_recovery('relay._agent_notify');
    PERFORM relay._check_between('max', max_rows, 1, 10000, NULL);
    PERFORM relay._check_between('payload_limit', payload_limit, 200, 7999, NULL);
    SELECT * INTO h FROM relay.handlers x WHERE x.id = _agent_notify.handler_id;
    IF NOT FOUND OR h.paused OR h.kind <> 'notify' THEN
        RETURN 0;
    END IF;
    ack := coalesce((h.options ->> 'ack')::boolean, false);
    inline := coalesce((h.options ->> 'inline_payload')::boolean, true);
    -- Fire mode may take a key's whole run: one transaction's notifications
    -- arrive in order. Ack mode takes one per key (the next waits for the
    -- ack). Fire mode takes no leases: the claim's row locks last to the
    -- commit that deletes the rows; a delivery sent by reference gets its
    -- lease here, under that lock.
    -- The leased delivery's lease row stays as it is: deleted with it (fire
    -- mode), or the lease the message carries (ack mode, by reference).
    WITH c AS MATERIALIZED (
        SELECT x.*, x.ordinality AS ord
          FROM relay._claim_handler(h, max_rows, relay._option_ms(h.options, 'lease', 30000),
                                    CASE WHEN ack THEN 1 ELSE max_rows END, ack, notified => ack)
               WITH ORDINALITY AS x
         WHERE leased_id IS NULL
        UNION ALL
        SELECT d.id, d.event_id, coalesce(d.wire_topic, d.topic), d.key, d.seq, d.payload, d.headers,
               d.attempt + 1, d.priority::integer, d.published_at, l.lease_until, l.token, 1::bigint, 1::bigint
          FROM relay.leases l JOIN relay.deliveries d ON d.id = l.delivery_id
         WHERE leased_id IS NOT NULL AND l.delivery_id = leased_id AND l.token = leased_token
           AND l.handler_id = h.id AND l.completed_by IS NULL AND l.lease_until > clock_timestamp()
    ), t AS MATERIALIZED (
        SELECT c.*, relay._handover_traceparent(c.headers) AS tp FROM c
    ), b AS MATERIALIZED (
        SELECT c.ord, c.id, c.event_id, c.topic, c.key, c.seq, c.attempt, c.lease_until, c.lease, c.tp,
               CASE WHEN inline THEN
                   -- The traceparent (of a traced event) and the lease (ack
                   -- mode) after the object's fields, as the extension's
                   -- dispatcher appends them (jsonb would sort them among them).
                   left(jsonb_build_object('id', c.id, 'key', c.key, 'seq', c.seq, 'topic', c.topic,
                                           'attempt', c.attempt, 'headers', c.headers,
                                           'payload', c.payload, 'event_id', c.event_id)::text, -1)
                   || CASE WHEN c.tp IS NOT NULL THEN ', "traceparent": "' || c.tp || '"' ELSE '' END
                   || CASE WHEN ack THEN ', "lease": "' || c.lease || '"' ELSE '' END || '}'
               END AS body
          FROM t c
    ), f AS MATERIALIZED (
        SELECT b.ord, b.id, b.event_id, b.topic, b.key, b.seq, b.attempt, b.lease_until, b.tp,
               (b.body IS NULL OR octet_length(b.body) > payload_limit) AS ref,
               CASE WHEN b.body IS NULL OR octet_length(b.body) > payload_limit
                    THEN coalesce(b.lease, gen_random_uuid()) END AS token,
               b.body
          FROM b
    ), leased AS (
        INSERT INTO relay.leases AS l (delivery_id, handler_id, token, lease_until, owner_pid)
        SELECT f.id, h.id, f.token, f.lease_until, pg_backend_pid() FROM f WHERE f.ref AND NOT ack
        ON CONFLICT (delivery_id) DO UPDATE
           SET token = excluded.token, lease_until = excluded.lease_until, owner_pid = excluded.owner_pid,
               completed_by = NULL
         WHERE l.completed_by IS NOT NULL
        RETURNING 1
    )
    -- The subquery's order is the order the notifications are queued in.
    SELECT count(pg_notify(h.target,
                           CASE WHEN s.ref
                                THEN (jsonb_build_object('id', s.id, 'event_id', s.event_id, 'topic', s.topic,
                                                         'key', s.key, 'seq', s.seq, 'attempt', s.attempt,
                                                         'ref', true, 'lease', s.token)
                                      || CASE WHEN s.tp IS NOT NULL THEN jsonb_build_object('traceparent', s.tp)
                                              ELSE '{}' END)::text
                                ELSE s.body END)),
           array_agg(s.id) FILTER (WHERE NOT s.ref AND NOT ack)
      INTO n, fired
      FROM (SELECT * FROM f ORDER BY f.ord) s;
    -- Statements of their own: this statement's snapshot was taken before
    -- the claim's, and a row published in between, claimed and sent, would
    -- be invisible to a DELETE here, and stay to be sent again.
    DELETE FROM relay.deliveries d WHERE d.id = ANY (fired);
    DELETE FROM relay.leases l WHERE l.delivery_id = ANY (fired);
    RETURN n;
END
$$;

-- The end of attempts the agent made (http), each fenced by its lease: a
-- delivery whose lease is not the one given (taken over, completed, expired,
-- or the server restarted) is left as it is ('stale'). outcomes[i]:
-- 'delivered' (deleted), 'retry' (attempt + 1, ready again retry_ms[i] from
-- now) or 'dead' (a dead letter with errors[i] and statuses[i]): what core
-- decided (core::classify_result). Returns (id, what was done). One
-- statement for the batch; the leases are locked in id order (as every
-- settler does, so two never deadlock), waiting for a completion in
-- progress (relay_ack's lock) and then seeing it. An id given twice is
-- settled once, by its first entry.
CREATE FUNCTION relay._agent_settle(ids bigint[], leases uuid[], outcomes text[], retry_ms bigint[],
                                    errors text[], statuses integer[], OUT id bigint, OUT result text)
RETURNS SETOF record LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off SET jit = off
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    bad text;
BEGIN
    PERFORM relay._refuse_in_recovery('relay._agent_settle');
    SELECT coalesce(t.outcome, 'NULL') INTO bad
      FROM unnest(ids, outcomes) WITH ORDINALITY AS t(id, outcome, o)
     WHERE t.outcome IS NULL OR t.outcome NOT IN ('delivered', 'retry', 'dead')
     ORDER BY t.id, t.o LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'outcome must be delivered, retry or dead, not %', bad
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH t AS (
        SELECT u.*, row_number() OVER (PARTITION BY u.id ORDER BY u.o) AS nth
          FROM unnest(ids, leases, outcomes, retry_ms, errors, statuses) WITH ORDINALITY
               AS u(id, lease, outcome, retry_ms, error, status, o)
    ), held AS MATERIALIZED (
        SELECT s.*, s.nth = 1 AND x.delivery_id IS NOT NULL AS ok
          FROM (SELECT * FROM t ORDER BY t.id, t.o) s
          LEFT JOIN LATERAL (SELECT l.delivery_id FROM relay.leases l
                              WHERE l.delivery_id = s.id AND l.token = s.lease AND l.completed_by IS NULL
                                AND l.lease_until > clock_timestamp()
                                FOR UPDATE) x ON s.nth = 1
    ), unleased AS (
        DELETE FROM relay.leases l WHERE l.delivery_id = ANY (ARRAY(SELECT k.id FROM held k WHERE k.ok))
        RETURNING 1
    ), delivered AS (
        DELETE FROM relay.deliveries d
         WHERE d.id = ANY (ARRAY(SELECT k.id FROM held k WHERE k.ok AND k.outcome = 'delivered'))
        RETURNING 1
    ), retried AS (
        UPDATE relay.deliveries d
           SET attempt = d.attempt + 1, last_error = k.error,
               not_before = clock_timestamp() + greatest(coalesce(k.retry_ms, 0), 0) * interval '1 millisecond'
          FROM held k
         WHERE k.ok AND k.outcome = 'retry' AND d.id = k.id
        RETURNING 1
    ), moved AS (
        DELETE FROM relay.deliveries d
         WHERE d.id = ANY (ARRAY(SELECT k.id FROM held k WHERE k.ok AND k.outcome = 'dead'))
        RETURNING d.*
    ), buried AS (
        INSERT INTO relay.dead_letters (id, event_id, seq, published_at, failed_at, handler_id, attempts,
                                        last_status, lane, priority, handler, topic, wire_topic, key, payload,
                                        headers, last_error)
        SELECT m.id, m.event_id, m.seq, m.published_at, clock_timestamp(), m.handler_id, m.attempt + 1,
               nullif(k.status, 0), m.lane, m.priority,
               coalesce((SELECT hh.name FROM relay.handlers hh WHERE hh.id = m.handler_id), ''),
               m.topic, m.wire_topic, m.key, m.payload, m.headers, k.error
          FROM moved m JOIN held k ON k.id = m.id AND k.ok
        RETURNING 1
    )
    SELECT k.id, CASE WHEN k.ok THEN k.outcome ELSE 'stale' END FROM held k ORDER BY k.id, k.o;
END
$$;

-- Gives back leases of deliveries the agent claimed and never sent (it
-- stops, or they waited too long in its queue): ready again at once, no
-- attempt charged. A lease no longer held is left alone. Returns how many.
CREATE FUNCTION relay._agent_release(ids bigint[], leases uuid[]) RETURNS integer
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH gone AS (
        DELETE FROM relay.leases l
         USING unnest(ids, leases) AS t(id, lease)
         WHERE l.delivery_id = t.id AND l.token = t.lease AND l.completed_by IS NULL
        RETURNING 1)
    SELECT count(*)::integer FROM gone
$$;

-- An agent's counters (its /metrics, as JSON: "" its own, then one object
-- per handler by name), stored in relay.agent_reports for relay.workers,
-- relay.handler_stats and relay.handler_metrics (docs/managed.md, "The
-- agents' counters in the views"). Replaces what this agent reported before;
-- its rows count until three intervals and 10 s have passed without a new
-- report. Rows stale for an hour, of any agent, go. Returns the rows stored.
CREATE FUNCTION relay._agent_report(agent text, started_ms bigint, interval_ms bigint, report jsonb)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n integer;
BEGIN
    PERFORM relay._refuse_in_recovery('relay._agent_report');
    IF agent IS NULL OR length(agent) NOT BETWEEN 1 AND 256 THEN
        RAISE EXCEPTION 'agent must be a name of 1 to 256 characters' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF started_ms IS NULL OR started_ms < 0 THEN
        RAISE EXCEPTION 'started_ms must be a time in ms since the epoch, not %', coalesce(started_ms::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF interval_ms IS NULL OR interval_ms NOT BETWEEN 100 AND 3600000 THEN
        RAISE EXCEPTION 'interval_ms must be between 100 and 3600000, not %', coalesce(interval_ms::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_typeof(report) IS DISTINCT FROM 'object'
       OR EXISTS (SELECT 1 FROM jsonb_each(report) e WHERE jsonb_typeof(e.value) <> 'object') THEN
        RAISE EXCEPTION 'report must be a JSON object of objects' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    DELETE FROM relay.agent_reports r
     WHERE r.agent = _agent_report.agent OR r.stale_after < now() - interval '1 hour';
    INSERT INTO relay.agent_reports (agent, handler, backend_pid, started_at, reported_at, stale_after, counters)
    SELECT _agent_report.agent, e.key, pg_backend_pid(), to_timestamp(started_ms / 1000.0), now(),
           now() + (3 * interval_ms + 10000) * interval '1 millisecond', e.value
      FROM jsonb_each(report) e;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

GRANT USAGE ON SCHEMA relay TO relay_agent;
GRANT EXECUTE ON FUNCTION relay._agent_handlers(), relay._agent_claim(integer, integer, bigint, integer),
                          relay._agent_notify(integer, integer, integer, bigint, uuid),
                          relay._agent_settle(bigint[], uuid[], text[], bigint[], text[], integer[]),
                          relay._agent_release(bigint[], uuid[]),
                          relay._agent_report(text, bigint, bigint, jsonb)
    TO relay_agent;
