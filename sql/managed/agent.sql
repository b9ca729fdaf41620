-- relaybus-agent (docs/managed.md, "relaybus-agent") ----------------------------
-- What the background workers do for notify and http handlers, done by an
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
     WHERE h.kind IN ('notify', 'http')
     ORDER BY h.id
$$;

-- relay._claim for a handler the agent delivers (by id: a renamed handler is
-- the same one). Nothing for a paused, dropped or other handler. lease_ms is
-- the agent's (an http lease covers the request's timeout).
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
    IF NOT FOUND OR h.paused OR h.kind NOT IN ('notify', 'http') THEN
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
-- how many deliveries were sent.
CREATE FUNCTION relay._agent_notify(handler_id integer, max_rows integer, payload_limit integer)
RETURNS integer LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    h       relay.handlers;
    ack     boolean;
    inline  boolean;
    r       record;
    body    text;
    n       integer := 0;
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
    -- arrive in order. Ack mode takes one per key (the next waits for the ack).
    FOR r IN SELECT * FROM relay._claim_handler(h, max_rows, relay._option_ms(h.options, 'lease', 30000),
                                                CASE WHEN ack THEN 1 ELSE max_rows END)
    LOOP
        body := NULL;
        IF inline THEN
            body := jsonb_build_object('id', r.id, 'key', r.key, 'seq', r.seq, 'topic', r.topic,
                                       'attempt', r.attempt, 'headers', r.headers, 'payload', r.payload,
                                       'event_id', r.event_id)::text;
            IF ack THEN
                -- After the object's fields, as the extension's dispatcher
                -- appends it (jsonb would sort it among them).
                body := left(body, -1) || ', "lease": "' || r.lease || '"}';
            END IF;
            IF octet_length(body) > payload_limit THEN
                body := NULL;
            END IF;
        END IF;
        IF body IS NULL THEN
            body := jsonb_build_object('id', r.id, 'event_id', r.event_id, 'topic', r.topic, 'key', r.key,
                                       'seq', r.seq, 'attempt', r.attempt, 'ref', true, 'lease', r.lease)::text;
        ELSIF NOT ack THEN
            DELETE FROM relay.deliveries d WHERE d.id = r.id;
            DELETE FROM relay.leases l WHERE l.delivery_id = r.id;
        END IF;
        PERFORM pg_notify(h.target, body);
        n := n + 1;
    END LOOP;
    RETURN n;
END
$$;

-- The end of attempts the agent made (http), each fenced by its lease: a
-- delivery whose lease is not the one given (taken over, completed, expired,
-- or the server restarted) is left as it is ('stale'). outcomes[i]:
-- 'delivered' (deleted), 'retry' (attempt + 1, ready again retry_ms[i] from
-- now) or 'dead' (a dead letter with errors[i] and statuses[i]): what core
-- decided (core::classify_result). Returns (id, what was done).
CREATE FUNCTION relay._agent_settle(ids bigint[], leases uuid[], outcomes text[], retry_ms bigint[],
                                    errors text[], statuses integer[], OUT id bigint, OUT result text)
RETURNS SETOF record LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s record;
BEGIN
    PERFORM relay._refuse_in_recovery('relay._agent_settle');
    FOR s IN SELECT t.* FROM unnest(ids, leases, outcomes, retry_ms, errors, statuses)
                               AS t(id, lease, outcome, retry_ms, error, status)
              ORDER BY t.id
    LOOP
        IF s.outcome IS NULL OR s.outcome NOT IN ('delivered', 'retry', 'dead') THEN
            RAISE EXCEPTION 'outcome must be delivered, retry or dead, not %', coalesce(s.outcome, 'NULL')
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        id := s.id;
        -- Waits for a completion in progress (relay_ack's lock), then sees it.
        PERFORM 1 FROM relay.leases l
          WHERE l.delivery_id = s.id AND l.token = s.lease AND l.completed_by IS NULL
            AND l.lease_until > clock_timestamp()
            FOR UPDATE;
        IF NOT FOUND THEN
            result := 'stale';
            RETURN NEXT;
            CONTINUE;
        END IF;
        DELETE FROM relay.leases l WHERE l.delivery_id = s.id;
        IF s.outcome = 'delivered' THEN
            DELETE FROM relay.deliveries d WHERE d.id = s.id;
        ELSIF s.outcome = 'retry' THEN
            UPDATE relay.deliveries d
               SET attempt = d.attempt + 1, last_error = s.error,
                   not_before = clock_timestamp() + greatest(coalesce(s.retry_ms, 0), 0) * interval '1 millisecond'
             WHERE d.id = s.id;
        ELSE
            WITH moved AS (DELETE FROM relay.deliveries d WHERE d.id = s.id RETURNING d.*)
            INSERT INTO relay.dead_letters (id, event_id, seq, published_at, failed_at, handler_id, attempts,
                                            last_status, lane, priority, handler, topic, wire_topic, key, payload,
                                            headers, last_error)
            SELECT m.id, m.event_id, m.seq, m.published_at, clock_timestamp(), m.handler_id, m.attempt + 1,
                   nullif(s.status, 0), m.lane, m.priority,
                   coalesce((SELECT h.name FROM relay.handlers h WHERE h.id = m.handler_id), ''),
                   m.topic, m.wire_topic, m.key, m.payload, m.headers, s.error
              FROM moved m;
        END IF;
        result := s.outcome;
        RETURN NEXT;
    END LOOP;
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

GRANT USAGE ON SCHEMA relay TO relay_agent;
GRANT EXECUTE ON FUNCTION relay._agent_handlers(), relay._agent_claim(integer, integer, bigint, integer),
                          relay._agent_notify(integer, integer, integer),
                          relay._agent_settle(bigint[], uuid[], text[], bigint[], text[], integer[]),
                          relay._agent_release(bigint[], uuid[])
    TO relay_agent;
