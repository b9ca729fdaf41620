-- Pull consumers (PL/pgSQL) --------------------------------------------------------
-- Leases are rows of relay.leases (see there) and receipts as in the extension
-- (docs/consumers.md): relay_claim returns each lease's token, relay_ack /
-- relay_nack / relay_extend name it. A completion marks the lease row with
-- its transaction and keeps it locked to the end of it, so a claimer that
-- would charge the lease as expired waits for it, and finds the delivery gone
-- (an ack) or the lease ended (a nack) once it committed.

CREATE FUNCTION relay._refuse_in_recovery(fn text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF pg_is_in_recovery() THEN
        RAISE EXCEPTION 'cannot execute %() on a server in recovery', fn
            USING ERRCODE = 'read_only_sql_transaction',
                  HINT = 'Leases are taken and completed on the primary only.';
    END IF;
END
$$;

-- What every completion checks first: the server and the id.
CREATE FUNCTION relay._check_completion(fn text, id bigint) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM relay._refuse_in_recovery(fn);
    IF id IS NULL THEN
        RAISE EXCEPTION 'id must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
END
$$;

-- A lease length given as an interval (what: the argument's name), in ms:
-- NULL for NULL, else 1 second to 1 day.
CREATE FUNCTION relay._lease_ms(what text, i interval) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    ms bigint := round(extract(epoch FROM i) * 1000);
BEGIN
    IF ms NOT BETWEEN 1000 AND 86400000 THEN
        RAISE EXCEPTION '% must be between 1 second and 1 day', what USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN ms;
END
$$;

-- A handler option (as given, validated) as milliseconds, or the default.
CREATE FUNCTION relay._option_ms(options jsonb, name text, fallback bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(relay._duration_ms(options ->> name), fallback)
$$;

-- A failed attempt of each delivery (core::decide_failure): dead after
-- max_attempts, else ready again after retry_ms (NULL: the handler's backoff
-- with full jitter). Returns (id, 'retry' | 'dead') for the rows still there.
CREATE FUNCTION relay._fail(ids bigint[], error text, retry_ms bigint, OUT id bigint, OUT outcome text)
RETURNS SETOF record LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    d   record;
    ms  bigint;
BEGIN
    FOR d IN SELECT x.id, x.attempt + 1 AS attempts_now, h.name AS handler,
                    coalesce((h.options ->> 'max_attempts')::numeric::integer, 10) AS max_attempts,
                    relay._option_ms(h.options, 'backoff_base', 1000) AS base_ms,
                    relay._option_ms(h.options, 'backoff_max', 600000) AS max_ms
               FROM relay.deliveries x LEFT JOIN relay.handlers h ON h.id = x.handler_id
              WHERE x.id = ANY (_fail.ids) ORDER BY x.id
    LOOP
        id := d.id;
        IF d.attempts_now >= d.max_attempts THEN
            WITH moved AS (DELETE FROM relay.deliveries x WHERE x.id = d.id RETURNING x.*)
            INSERT INTO relay.dead_letters (id, event_id, seq, published_at, failed_at, handler_id, attempts, lane,
                                            priority, handler, topic, wire_topic, key, payload, headers, last_error)
            SELECT m.id, m.event_id, m.seq, m.published_at, clock_timestamp(), m.handler_id, d.attempts_now, m.lane,
                   m.priority, coalesce(d.handler, ''), m.topic, m.wire_topic, m.key, m.payload, m.headers, _fail.error
              FROM moved m;
            outcome := 'dead';
        ELSE
            ms := coalesce(_fail.retry_ms,
                           floor(random() * (relay._backoff_ceiling_ms(d.base_ms, d.max_ms, d.attempts_now) + 1))::bigint);
            UPDATE relay.deliveries x
               SET attempt = d.attempts_now, last_error = _fail.error,
                   not_before = clock_timestamp() + ms * interval '1 millisecond'
             WHERE x.id = d.id;
            outcome := 'retry';
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;

-- Checks and locks the leases of ids for a completion (mark: and marks them
-- as this transaction's, see relay.leases); tokens[i] NULL: the id-only form
-- (a lease this session took). Raises P0002 for a delivery that is gone
-- (before any lease error, when missing_first), else 55P03 for the first
-- lease not held, in id order.
CREATE FUNCTION relay._hold_leases(ids bigint[], tokens uuid[], missing_first boolean, missing_detail boolean,
                                   mark boolean)
RETURNS void LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    l       record;
    reason  text;
    detail  text;
    gone    bigint;
BEGIN
    FOR l IN SELECT t.i, t.id, t.token, x.token AS held, x.lease_until, x.owner_pid, x.completed_by,
                    (x.delivery_id IS NULL AND EXISTS (SELECT 1 FROM relay.leases y WHERE y.delivery_id = t.id)) AS locked
               FROM unnest(ids, tokens) WITH ORDINALITY AS t(id, token, i)
               LEFT JOIN LATERAL (SELECT * FROM relay.leases z WHERE z.delivery_id = t.id
                                  FOR UPDATE SKIP LOCKED) x ON true
              ORDER BY t.id, t.i
    LOOP
        reason := NULL;
        IF l.locked THEN
            reason := 'another holder';
            detail := CASE WHEN l.token IS NOT NULL
                           THEN 'The lease token does not match the current lease (stale or forged), or another transaction is completing it.'
                           ELSE 'Another transaction is completing it.' END;
        ELSIF l.held IS NULL OR NOT relay._is_lease(l.completed_by) THEN
            reason := 'no lease';
            detail := 'Nobody holds it: it was never handed over, or it was completed, or the server restarted.';
        ELSIF l.completed_by IS NOT NULL THEN
            -- This transaction completed it already: the lease is its own.
            IF l.token IS NOT NULL AND l.token <> l.held THEN
                reason := 'another holder';
                detail := 'The lease token does not match the current lease (stale or forged), or another transaction is completing it.';
            END IF;
        ELSIF l.lease_until <= clock_timestamp() THEN
            reason := 'it expired';
            detail := 'The lease ran out; the next claimer counts that as a failed attempt and hands it over again.';
        ELSIF l.token IS NOT NULL AND l.token <> l.held THEN
            reason := 'another holder';
            detail := 'The lease token does not match the current lease (stale or forged), or another transaction is completing it.';
        ELSIF l.token IS NULL AND l.owner_pid <> pg_backend_pid() THEN
            reason := 'another holder';
            detail := 'This session did not take the lease; without a token only the session that claimed a delivery can complete it.';
        END IF;
        IF reason IS NOT NULL THEN
            IF missing_first THEN
                SELECT t.id INTO gone FROM unnest(ids) AS t(id)
                 WHERE NOT EXISTS (SELECT 1 FROM relay.deliveries d WHERE d.id = t.id) ORDER BY t.id LIMIT 1;
                IF gone IS NOT NULL THEN
                    IF missing_detail THEN
                        RAISE EXCEPTION 'delivery % does not exist', gone USING ERRCODE = 'no_data_found',
                            DETAIL = 'It was acked or dead-lettered already, or never existed; nothing was acked.',
                            HINT = 'If your lease ran out, another consumer may have handled it.';
                    END IF;
                    RAISE EXCEPTION 'delivery % does not exist', gone USING ERRCODE = 'no_data_found';
                END IF;
            END IF;
            IF l.token IS NULL THEN
                RAISE EXCEPTION 'lease of delivery % is not held: %', l.id, reason
                    USING ERRCODE = 'lock_not_available', DETAIL = detail || ' Nothing was changed.',
                          HINT = 'Pass the lease token that relay_claim returned or the NOTIFY message carried ("lease").';
            END IF;
            RAISE EXCEPTION 'lease of delivery % is not held: %', l.id, reason
                USING ERRCODE = 'lock_not_available', DETAIL = detail || ' Nothing was changed.';
        END IF;
    END LOOP;
    IF mark THEN
        UPDATE relay.leases z SET completed_by = pg_current_xact_id()
         WHERE z.delivery_id = ANY (ids) AND z.completed_by IS NULL;
    END IF;
END
$$;

-- The claim of a handler's ready deliveries (relay_claim's, and
-- relaybus-agent's for the handlers it delivers): what relay._claim does once
-- the handler was found and may be claimed. lease_ms: the leases' length.
-- take_leases false (a fire-mode notify iteration, which deletes what it
-- claims in the same transaction): the rows are only locked, lease NULL.
-- notified: the leases are an ack-mode NOTIFY's (owner_pid 0, see
-- relay.leases); take_notified (relay_claim of an ack-mode notify handler):
-- such leases count as free and are taken over with a new token, so that a
-- consumer that starts gets what was sent to nobody at once.
--
-- Set-based: one statement finds the candidates, one locks them, one leases
-- them, whatever the batch; PL/pgSQL only merges the priority classes when
-- more than one has rows. The planner settings are the function's own (its
-- SET clause): no sequential scan, hash or merge join, so every statement is
-- index probes and nested loops whether or not the tables have statistics (a
-- fresh install, a burst before autovacuum's first ANALYZE, a plan cached
-- while the table was empty), and no JIT for the costs that leaves.
-- Generic plans: with the shapes fixed a custom plan buys nothing, and
-- PL/pgSQL would otherwise plan these statements again at every call when
-- the generic plan's estimate looks dearer (that doubled a one-row claim).
CREATE FUNCTION relay._claim_handler(h relay.handlers, max_rows integer, lease_ms bigint, per_key integer,
                                     take_leases boolean DEFAULT true, notified boolean DEFAULT false,
                                     take_notified boolean DEFAULT false)
RETURNS TABLE (id bigint, event_id bigint, topic text, key text, seq bigint, payload jsonb,
               headers jsonb, attempt integer, priority integer, published_at timestamptz,
               lease_until timestamptz, lease uuid)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off SET jit = off
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    until    timestamptz;
    t_now    timestamptz;
    aging    bigint := relay._setting('priority_aging', 'ms', 10000, 0, 2147483647);
    scan     bigint := relay._setting('claim_scan_limit', '', 10000, 100, 1000000);
    win      bigint;
    enough   boolean;
    charged  bigint[];
    c_id     bigint[];
    c_grp    integer[];
    g_cls    integer[];
    g_eff    integer[];
    g_ready  timestamptz[];
    g_len    integer[];
    g_from   integer[];
    m_id     bigint[];
    m_grp    integer[];
    heads    integer[] := ARRAY[NULL, NULL, NULL, NULL]::integer[];
    best     integer;
    r0       integer := 1;
    r1       integer;
    nrows    integer;
    lk       boolean[];
    p_ids    bigint[];
    p_tok    uuid[];
    n_ins    bigint;
    taken    bigint[] := '{}';
    tokens   uuid[] := '{}';
BEGIN
    -- A row this transaction completed is no lease to its own claims (they
    -- may take the delivery again, as the extension's do); other sessions
    -- see it leased until the completion commits. Rows of completions that
    -- committed are no leases: removed. Leases that
    -- ran out are charged a failed attempt, once: the charge removes the
    -- lease. A row a completion in progress holds is skipped, never waited
    -- for: that lease is taken, as in the extension.
    DELETE FROM relay.leases l
     WHERE l.delivery_id IN (SELECT z.delivery_id FROM relay.leases z
                              WHERE z.handler_id = h.id AND z.completed_by IS NOT NULL
                                AND NOT relay._is_lease(z.completed_by)
                                FOR UPDATE SKIP LOCKED);
    WITH expired AS (
        DELETE FROM relay.leases l
         WHERE l.delivery_id IN (SELECT z.delivery_id FROM relay.leases z
                                  WHERE z.handler_id = h.id AND z.lease_until <= clock_timestamp()
                                    AND z.completed_by IS NULL
                                    FOR UPDATE SKIP LOCKED)
        RETURNING l.delivery_id
    )
    SELECT array_agg(e.delivery_id) INTO charged FROM expired e;
    IF charged IS NOT NULL THEN
        PERFORM relay._fail(charged, 'lease expired', NULL);
    END IF;

    -- core::plan_claim's rules. A group is a key's run (from its head: no
    -- earlier seq left; up to per_key rows, stopping at the first row not
    -- ready or leased) or an unkeyed row, in the stream of its first row's
    -- priority class; the streams (id order, the oldest rows of each class)
    -- are merged by aged priority, then ready time, then id. The window read
    -- per class starts at twice the batch and grows (x4, up to
    -- claim_scan_limit) until each class either ran out or gave a batch of
    -- candidates: the merge then takes what a window of claim_scan_limit
    -- would, and a small claim does not read claim_scan_limit rows.
    t_now := clock_timestamp();
    win := least(scan, 2 * max_rows + 64);
    LOOP
        WITH w AS (
            SELECT * FROM (SELECT d.id, d.key, d.seq, d.priority, d.not_before FROM relay.deliveries d
                            WHERE d.handler_id = h.id AND d.priority >= 3 ORDER BY d.priority, d.id LIMIT win) p3
            UNION ALL
            SELECT * FROM (SELECT d.id, d.key, d.seq, d.priority, d.not_before FROM relay.deliveries d
                            WHERE d.handler_id = h.id AND d.priority = 2 ORDER BY d.priority, d.id LIMIT win) p2
            UNION ALL
            SELECT * FROM (SELECT d.id, d.key, d.seq, d.priority, d.not_before FROM relay.deliveries d
                            WHERE d.handler_id = h.id AND d.priority = 1 ORDER BY d.priority, d.id LIMIT win) p1
            UNION ALL
            SELECT * FROM (SELECT d.id, d.key, d.seq, d.priority, d.not_before FROM relay.deliveries d
                            WHERE d.handler_id = h.id AND d.priority <= 0 ORDER BY d.priority, d.id LIMIT win) p0
        ), s1 AS (
            SELECT w.id, w.key, w.seq, w.not_before, least(3, greatest(0, w.priority)) AS cls,
                   least(3, greatest(0, w.priority) + CASE WHEN aging > 0 THEN greatest(0, floor(
                       extract(epoch FROM t_now - w.not_before) * 1000 / aging))::integer ELSE 0 END) AS eff,
                   (w.not_before <= t_now
                    AND NOT EXISTS (SELECT 1 FROM relay.leases l
                                     WHERE l.delivery_id = w.id AND l.completed_by IS NULL
                                       AND NOT (take_notified AND l.owner_pid = 0))
                    AND w.id <> ALL (coalesce(charged, '{}'))) AS ok,
                   CASE WHEN w.key IS NULL THEN 1
                        ELSE row_number() OVER (PARTITION BY w.key ORDER BY w.seq) END AS pos,
                   lag(w.seq) OVER (PARTITION BY w.key ORDER BY w.seq) AS prev_seq
              FROM w
        ), s2 AS (
            SELECT r.*, bool_and(r.ok) OVER (PARTITION BY r.key, CASE WHEN r.key IS NULL THEN r.id END
                                            ORDER BY r.pos) AS run_ok
              FROM s1 r
        ), s3 AS (
            -- A run is in key order up to its first row with an earlier seq
            -- outside the window (before the head, or between two of its
            -- rows): one index range a row (both bounds in the index
            -- condition), only for the rows still wanted.
            SELECT r.*, bool_and(r.key IS NULL OR NOT EXISTS (
                       SELECT 1 FROM relay.deliveries e
                        WHERE e.handler_id = h.id AND e.key = r.key AND e.seq < r.seq
                          AND e.seq > coalesce(r.prev_seq, '-9223372036854775808'::bigint)))
                       OVER (PARTITION BY r.key, CASE WHEN r.key IS NULL THEN r.id END ORDER BY r.pos) AS in_order
              FROM s2 r
             WHERE r.run_ok AND r.pos <= per_key
        ), grows AS (
            SELECT r.id, r.pos, first_value(r.cls) OVER g AS gcls, first_value(r.eff) OVER g AS geff,
                   first_value(r.not_before) OVER g AS gready,
                   min(r.id) OVER (PARTITION BY r.key, CASE WHEN r.key IS NULL THEN r.id END) AS gid
              FROM s3 r
             WHERE r.in_order
            WINDOW g AS (PARTITION BY r.key, CASE WHEN r.key IS NULL THEN r.id END ORDER BY r.pos)
        ), numbered AS (
            SELECT x.*, dense_rank() OVER (ORDER BY x.gcls, x.gid)::integer AS gno FROM grows x
        ), groups AS (
            SELECT n.gno, min(n.gcls) AS gcls, min(n.geff) AS geff, min(n.gready) AS gready,
                   count(*)::integer AS glen
              FROM numbered n GROUP BY n.gno
        ), placed AS (
            SELECT g.*, (sum(g.glen) OVER (ORDER BY g.gno) - g.glen + 1)::integer AS gfrom FROM groups g
        )
        SELECT (SELECT array_agg(n.id ORDER BY n.gno, n.pos) FROM numbered n),
               (SELECT array_agg(n.gno ORDER BY n.gno, n.pos) FROM numbered n),
               (SELECT array_agg(p.gcls ORDER BY p.gno) FROM placed p),
               (SELECT array_agg(p.geff ORDER BY p.gno) FROM placed p),
               (SELECT array_agg(p.gready ORDER BY p.gno) FROM placed p),
               (SELECT array_agg(p.glen ORDER BY p.gno) FROM placed p),
               (SELECT array_agg(p.gfrom ORDER BY p.gno) FROM placed p),
               (SELECT bool_and(coalesce(rd.n, 0) < win OR coalesce(cd.n, 0) >= max_rows)
                  FROM generate_series(0, 3) AS c(cls)
                  LEFT JOIN (SELECT least(3, greatest(0, x.priority)) AS cls, count(*) AS n
                               FROM w x GROUP BY 1) rd ON rd.cls = c.cls
                  LEFT JOIN (SELECT x.gcls AS cls, count(*) AS n FROM numbered x GROUP BY 1) cd ON cd.cls = c.cls)
          INTO c_id, c_grp, g_cls, g_eff, g_ready, g_len, g_from, enough;
        EXIT WHEN enough OR win >= scan;
        win := least(scan, win * 4);
    END LOOP;

    -- The merge: rows in the order they are taken (m_id, with their group
    -- in m_grp). One class: its stream as it is. Else each class's stream
    -- starts at its first group; merged up to twice the batch (what a claim
    -- losing rows to concurrent claimers may go on to).
    IF coalesce(cardinality(g_cls), 0) = 0 OR g_cls[1] = g_cls[cardinality(g_cls)] THEN
        m_id := c_id;
        m_grp := c_grp;
    ELSE
        m_id := '{}';
        m_grp := '{}';
        FOR i IN 1 .. cardinality(g_cls) LOOP
            IF heads[g_cls[i] + 1] IS NULL THEN
                heads[g_cls[i] + 1] := i;
            END IF;
        END LOOP;
        LOOP
            best := NULL;
            FOR c IN 1 .. 4 LOOP
                CONTINUE WHEN heads[c] IS NULL OR heads[c] > cardinality(g_cls) OR g_cls[heads[c]] <> c - 1;
                IF best IS NULL OR g_eff[heads[c]] > g_eff[best]
                   OR (g_eff[heads[c]] = g_eff[best] AND (g_ready[heads[c]] < g_ready[best]
                       OR (g_ready[heads[c]] = g_ready[best] AND heads[c] < best))) THEN
                    best := heads[c];
                END IF;
            END LOOP;
            EXIT WHEN best IS NULL OR cardinality(m_id) >= 2 * max_rows;
            heads[g_cls[best] + 1] := best + 1;
            m_id := m_id || c_id[g_from[best] : g_from[best] + g_len[best] - 1];
            m_grp := m_grp || array_fill(best, ARRAY[g_len[best]]);
        END LOOP;
    END IF;

    -- Rounds of (lock, lease) over the next rows in merge order, as many as
    -- the batch still wants; one round unless concurrent claimers hold some.
    -- A lease row is seen by others once its claim commits; until then the
    -- claim holds the delivery's row lock, and another claimer skips the row
    -- (never waits for it) and the rest of its key's run. A run cut at the
    -- end of a round is not resumed in the next.
    until := clock_timestamp() + lease_ms * interval '1 millisecond';
    nrows := coalesce(cardinality(m_id), 0);
    WHILE r0 <= nrows AND cardinality(taken) < max_rows LOOP
        r1 := least(nrows, r0 + max_rows - cardinality(taken) - 1);
        -- A NOTIFY's lease to take over (take_notified) is locked here too,
        -- never waited for: an ack of it in progress holds it and then
        -- deletes the delivery, whose row this claim holds (a deadlock).
        SELECT array_agg(x.id IS NOT NULL
                         AND (NOT take_notified OR y.delivery_id IS NOT NULL
                              OR NOT EXISTS (SELECT 1 FROM relay.leases w
                                              WHERE w.delivery_id = c.id AND w.owner_pid = 0)) ORDER BY c.o) INTO lk
          FROM unnest(m_id[r0:r1]) WITH ORDINALITY AS c(id, o)
          LEFT JOIN LATERAL (SELECT d.id FROM relay.deliveries d WHERE d.id = c.id
                             FOR NO KEY UPDATE SKIP LOCKED) x ON true
          LEFT JOIN LATERAL (SELECT z.delivery_id FROM relay.leases z
                              WHERE take_notified AND x.id IS NOT NULL AND z.delivery_id = c.id AND z.owner_pid = 0
                              FOR UPDATE SKIP LOCKED) y ON true;
        -- A new statement, so a new snapshot (READ COMMITTED): a lease that a
        -- claim committed before this one locked the row is seen, and none
        -- can be added while the lock is held. Under REPEATABLE READ a lease
        -- committed after the snapshot makes the insert fail with 40001.
        WITH c AS (
            SELECT x.id, x.g, x.o FROM unnest(m_id[r0:r1], m_grp[r0:r1]) WITH ORDINALITY AS x(id, g, o)
        ), ok AS (
            SELECT c.id, c.o,
                   bool_and(lk[c.o] AND NOT EXISTS (SELECT 1 FROM relay.leases l
                                                     WHERE l.delivery_id = c.id AND l.completed_by IS NULL
                                                       AND NOT (take_notified AND l.owner_pid = 0)))
                       OVER (PARTITION BY c.g ORDER BY c.o) AS run_ok
              FROM c
        ), pick AS MATERIALIZED (
            SELECT ok.id, ok.o, CASE WHEN take_leases THEN gen_random_uuid() END AS t FROM ok WHERE ok.run_ok
        ), ins AS (
            INSERT INTO relay.leases AS l (delivery_id, handler_id, token, lease_until, owner_pid)
            SELECT p.id, h.id, p.t, until, CASE WHEN notified THEN 0 ELSE pg_backend_pid() END
              FROM pick p WHERE take_leases
            ON CONFLICT (delivery_id) DO UPDATE
               SET token = excluded.token, lease_until = excluded.lease_until, owner_pid = excluded.owner_pid,
                   completed_by = NULL
             WHERE l.completed_by IS NOT NULL OR (take_notified AND l.owner_pid = 0)
            RETURNING 1
        )
        SELECT array_agg(p.id ORDER BY p.o), array_agg(p.t ORDER BY p.o), (SELECT count(*) FROM ins)
          INTO p_ids, p_tok, n_ins
          FROM pick p;
        IF take_leases AND n_ins <> coalesce(cardinality(p_ids), 0) THEN
            RAISE EXCEPTION 'relay._claim_handler: % of % leases taken', n_ins, cardinality(p_ids)
                USING ERRCODE = 'internal_error', DETAIL = 'A lease appeared on a row this claim had locked.';
        END IF;
        taken := taken || coalesce(p_ids, '{}');
        tokens := tokens || coalesce(p_tok, '{}');
        r0 := r1 + 1;
        WHILE r0 <= nrows AND m_grp[r0] = m_grp[r1] LOOP
            r0 := r0 + 1;
        END LOOP;
    END LOOP;

    RETURN QUERY
        SELECT d.id, d.event_id, coalesce(d.wire_topic, d.topic), d.key, d.seq, d.payload, d.headers, d.attempt + 1, d.priority::integer,
               d.published_at, until, x.token
          FROM unnest(taken, tokens) WITH ORDINALITY AS x(id, token, o)
          JOIN relay.deliveries d ON d.id = x.id
         ORDER BY x.o;
END
$$;

CREATE FUNCTION relay._claim(handler_name text, max_rows integer, lease_for interval, per_key integer)
RETURNS TABLE (id bigint, event_id bigint, topic text, key text, seq bigint, payload jsonb,
               headers jsonb, attempt integer, priority integer, published_at timestamptz,
               lease_until timestamptz, lease uuid)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    h        relay.handlers;
    lease_ms bigint;
BEGIN
    PERFORM relay._refuse_in_recovery('relay_claim');
    IF handler_name IS NULL THEN
        RAISE EXCEPTION 'handler must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM relay._check_between('max', max_rows, 1, 10000, NULL);
    per_key := coalesce(per_key, 1);
    PERFORM relay._check_between('per_key', per_key, 1, 10000, NULL);
    SELECT * INTO h FROM relay.handlers x WHERE x.name = handler_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'handler "%" does not exist', handler_name USING ERRCODE = 'undefined_object';
    END IF;
    IF h.kind <> 'pull' AND NOT (h.kind = 'notify' AND coalesce((h.options ->> 'ack')::boolean, false)) THEN
        RAISE EXCEPTION 'handler "%" is not a pull handler or an ack-mode notify handler', handler_name
            USING ERRCODE = 'wrong_object_type',
                  DETAIL = CASE WHEN h.kind = 'notify'
                                THEN 'It is a fire-and-forget notify handler: its deliveries complete when sent.'
                                ELSE 'It is a ' || h.kind || ' handler; its deliveries are handed over by the background workers.' END;
    END IF;
    lease_ms := coalesce(relay._lease_ms('lease', lease_for), relay._option_ms(h.options, 'lease', 30000));
    IF h.paused THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM relay._claim_handler(h, max_rows, lease_ms, per_key,
                                                    take_notified => h.kind = 'notify');
END
$$;

-- LANGUAGE sql: in PL/pgSQL the argument lease and the result column lease
-- would be one variable.
CREATE FUNCTION relay_claim(handler text, max integer DEFAULT 100, lease interval DEFAULT NULL,
                            per_key integer DEFAULT 1)
RETURNS TABLE (id bigint, event_id bigint, topic text, key text, seq bigint, payload jsonb,
               headers jsonb, attempt integer, priority integer, published_at timestamptz,
               lease_until timestamptz, lease uuid, traceparent text)
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT c.*, relay._handover_traceparent(c.headers) FROM relay._claim($1, $2, $3, $4) c
$$;

CREATE FUNCTION relay_ack(ids bigint[], leases uuid[] DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n      integer;
    nl     integer;
    tokens  uuid[];
    done    integer;
    missing bigint;
BEGIN
    PERFORM relay._refuse_in_recovery('relay_ack');
    IF relay_ack.ids IS NULL THEN
        RAISE EXCEPTION 'ids must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    n := coalesce(cardinality(relay_ack.ids), 0);
    IF relay_ack.leases IS NOT NULL THEN
        nl := coalesce(cardinality(relay_ack.leases), 0);
        IF nl <> n THEN
            RAISE EXCEPTION 'leases must have as many elements as ids (%), not %', n, nl
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
    IF n = 0 THEN
        RETURN 0;
    END IF;
    FOR i IN 1 .. n LOOP
        IF (SELECT x FROM unnest(relay_ack.ids) WITH ORDINALITY AS t(x, o) WHERE o = i) IS NULL THEN
            RAISE EXCEPTION 'ids[%] must not be NULL', i USING ERRCODE = 'null_value_not_allowed';
        END IF;
    END LOOP;
    tokens := coalesce(ARRAY(SELECT x FROM unnest(relay_ack.leases) WITH ORDINALITY AS t(x, o) ORDER BY o),
                       array_fill(NULL::uuid, ARRAY[n]));
    PERFORM relay._hold_leases(ARRAY(SELECT x FROM unnest(relay_ack.ids) WITH ORDINALITY AS t(x, o) ORDER BY o),
                               tokens, true, true, true);
    -- Held, yet gone: cancelled while leased (relay_cancel refuses that only
    -- for leases it sees).
    missing := (SELECT min(x) FROM unnest(relay_ack.ids) AS x
                 WHERE NOT EXISTS (SELECT 1 FROM relay.deliveries d WHERE d.id = x));
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'delivery % does not exist', missing USING ERRCODE = 'no_data_found',
            DETAIL = 'It was acked or dead-lettered already, or never existed; nothing was acked.',
            HINT = 'If your lease ran out, another consumer may have handled it.';
    END IF;
    DELETE FROM relay.deliveries d WHERE d.id = ANY (relay_ack.ids);
    GET DIAGNOSTICS done = ROW_COUNT;
    RETURN done;
END
$$;

CREATE FUNCTION relay_nack(id bigint, error text DEFAULT NULL, retry_in interval DEFAULT NULL,
                           lease uuid DEFAULT NULL)
RETURNS text LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    retry_ms bigint;
    result   text;
BEGIN
    PERFORM relay._check_completion('relay_nack', relay_nack.id);
    IF relay_nack.retry_in IS NOT NULL THEN
        retry_ms := round(extract(epoch FROM relay_nack.retry_in) * 1000);
        IF retry_ms < 0 THEN
            RAISE EXCEPTION 'retry_in must not be negative' USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF retry_ms > 366::bigint * 86400000 THEN
            RAISE EXCEPTION 'retry_in must be at most 366 days' USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
    PERFORM relay._hold_leases(ARRAY[relay_nack.id], ARRAY[relay_nack.lease], true, false, true);
    SELECT f.outcome INTO result FROM relay._fail(ARRAY[relay_nack.id], relay_nack.error, retry_ms) f;
    IF result IS NULL THEN
        RAISE EXCEPTION 'delivery % does not exist', relay_nack.id USING ERRCODE = 'no_data_found';
    END IF;
    RETURN result;
END
$$;

CREATE FUNCTION relay_extend(id bigint, lease uuid, extend_by interval DEFAULT NULL)
RETURNS timestamptz LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ms    bigint;
    hopts jsonb;
    until timestamptz;
BEGIN
    PERFORM relay._check_completion('relay_extend', relay_extend.id);
    ms := relay._lease_ms('extend_by', relay_extend.extend_by);
    SELECT coalesce(h.options, '{}') INTO hopts
      FROM relay.deliveries d LEFT JOIN relay.handlers h ON h.id = d.handler_id WHERE d.id = relay_extend.id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'delivery % does not exist', relay_extend.id USING ERRCODE = 'no_data_found',
            DETAIL = 'It was acked or dead-lettered already, or never existed.';
    END IF;
    ms := coalesce(ms, relay._option_ms(hopts, 'lease', 30000));
    PERFORM relay._hold_leases(ARRAY[relay_extend.id], ARRAY[relay_extend.lease], false, false, false);
    until := clock_timestamp() + ms * interval '1 millisecond';
    UPDATE relay.leases l SET lease_until = until WHERE l.delivery_id = relay_extend.id;
    RETURN until;
END
$$;
