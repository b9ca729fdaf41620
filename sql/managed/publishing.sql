-- Publishing (PL/pgSQL; run their statements as the owner) ------------------------
-- The extension's rules (src/pg/publish.cpp), statement by statement: the
-- arguments are checked first, a dedupe key is looked up under its lock, the
-- deliveries table is locked before the routes are read (relay_drop_handler),
-- a key's counter row is bumped before the event id is drawn (so within a key
-- id order and seq order are commit order: the row lock is held to commit),
-- then one delivery per (event, routed handler).

-- Checks shared by relay_publish and relay_publish_batch (publish_args.cpp).
CREATE FUNCTION relay._check_publish(fn text, topic text, headers jsonb, priority integer,
                                     not_before timestamptz)
RETURNS void LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF current_setting('transaction_read_only')::boolean THEN
        RAISE EXCEPTION 'cannot execute %() in a read-only transaction', fn
            USING ERRCODE = 'read_only_sql_transaction';
    END IF;
    PERFORM relay._check_topic(topic, false);
    IF headers IS NOT NULL AND jsonb_typeof(headers) <> 'object' THEN
        RAISE EXCEPTION 'headers must be a JSON object' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM relay._check_between('priority', priority, 0, 3, '0 is the lowest class and 3 the highest; the default is 1.');
    IF not_before IN ('infinity', '-infinity') THEN
        RAISE EXCEPTION 'not_before must be a finite time' USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$$;

-- A payload's size as the extension measures it (the jsonb value, without its
-- header); element: its position in a batch, or NULL.
CREATE FUNCTION relay._check_payload(payload jsonb, element integer)
RETURNS void LANGUAGE plpgsql STABLE AS $$
DECLARE
    lim  bigint := relay._setting('max_payload_bytes', 'B', 1048576, 1, 1073741823);
    size bigint := pg_column_size(payload) - 4;
BEGIN
    IF size > lim THEN
        RAISE EXCEPTION 'payload is too large: %', CASE WHEN element IS NULL THEN size || ' bytes'
                                                        ELSE 'payloads[' || element || '] is ' || size || ' bytes' END
            USING ERRCODE = 'program_limit_exceeded', DETAIL = 'relaybus.max_payload_bytes is ' || lim || '.';
    END IF;
END
$$;

-- An ordering key (what = 'key') or a dedupe key (what = 'dedupe_key').
CREATE FUNCTION relay._check_key(what text, key text, element integer)
RETURNS void LANGUAGE plpgsql STABLE AS $$
DECLARE
    lim integer := relay._setting('max_key_bytes', 'B', 512, 1, 2048);
    len integer := octet_length(key);
BEGIN
    IF len > lim THEN
        RAISE EXCEPTION '% is too long: %', what,
            CASE WHEN element IS NULL THEN len || ' bytes'
                 WHEN what = 'key' THEN 'keys[' || element || '] is ' || len || ' bytes'
                 ELSE 'dedupe_keys[' || element || '] has ' || len || ' bytes' END
            USING ERRCODE = 'string_data_right_truncation', DETAIL = 'relaybus.max_key_bytes is ' || lim || '.';
    END IF;
    IF len = 0 AND what = 'key' THEN
        IF element IS NULL THEN
            RAISE EXCEPTION 'key must not be empty' USING ERRCODE = 'invalid_parameter_value',
                HINT = 'Pass NULL for an event without an ordering key.';
        END IF;
        RAISE EXCEPTION 'key must not be empty: keys[%] is ''''', element USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Use NULL for an event without an ordering key.';
    END IF;
END
$$;

-- The events of one call (keys[i] NULL: unkeyed) as deliveries; returns their
-- ids. Nothing is written and no counter moves when no route matches.
CREATE FUNCTION relay._publish_rows(topic text, payloads jsonb[], keys text[], headers jsonb,
                                    priority integer, not_before timestamptz)
RETURNS bigint[] LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    hids  integer[];
    wires text[];
    kinds text[];
    seqs  bigint[];
    eids  bigint[];
    h     integer;
BEGIN
    -- Before the routes are read: a relay_drop_handler in progress is waited for.
    LOCK TABLE relay.deliveries IN ROW EXCLUSIVE MODE;
    SELECT array_agg(r.handler_id ORDER BY r.handler_id), array_agg(r.wire_name ORDER BY r.handler_id),
           array_agg(r.kind ORDER BY r.handler_id)
      INTO hids, wires, kinds
      FROM relay._routes_for(topic) r;
    IF hids IS NULL THEN
        RETURN ARRAY(SELECT nextval('relay.event_id_seq') FROM generate_series(1, cardinality(payloads)));
    END IF;
    -- Counters in key order, so two publishers of the same keys never deadlock;
    -- each event of a key takes the next seq, in call order.
    IF EXISTS (SELECT 1 FROM unnest(keys) k WHERE k IS NOT NULL) THEN
        WITH bumped AS (
            INSERT INTO relay.key_seqs AS k (key, seq)
            SELECT u.key, count(*) FROM unnest(keys) AS u(key) WHERE u.key IS NOT NULL
             GROUP BY u.key ORDER BY u.key COLLATE "C"
            ON CONFLICT (key) DO UPDATE SET seq = k.seq + excluded.seq
            RETURNING k.key, k.seq
        )
        SELECT array_agg(s.seq ORDER BY s.o) INTO seqs
          FROM (SELECT e.o, b.seq - count(*) OVER w + row_number() OVER (w ORDER BY e.o) AS seq
                  FROM unnest(keys) WITH ORDINALITY AS e(key, o) LEFT JOIN bumped b ON b.key = e.key
                WINDOW w AS (PARTITION BY e.key)) s;
    END IF;
    eids := ARRAY(SELECT nextval('relay.event_id_seq') FROM generate_series(1, cardinality(payloads)) AS o ORDER BY o);
    -- One handler (most topics): the rows in the order unnest gives them, with
    -- no join and no sort of the payloads.
    IF cardinality(hids) = 1 THEN
        INSERT INTO relay.deliveries (id, event_id, seq, published_at, not_before, handler_id, attempt,
                                      lane, priority, topic, wire_topic, key, payload, headers)
        SELECT nextval('relay.delivery_id_seq'), e.eid, e.seq, now(), coalesce(_publish_rows.not_before, now()),
               hids[1], 0, CASE WHEN e.key IS NULL THEN e.eid % 64 ELSE relay.lane_of(e.key) END,
               _publish_rows.priority, _publish_rows.topic, wires[1], e.key, e.p, _publish_rows.headers
          FROM unnest(eids, coalesce(seqs, '{}'), keys, payloads) AS e(eid, seq, key, p);
        IF kinds[1] <> 'pull' THEN
            PERFORM relay._wake(hids, kinds);
        END IF;
        RETURN eids;
    END IF;
    INSERT INTO relay.deliveries (id, event_id, seq, published_at, not_before, handler_id, attempt,
                                  lane, priority, topic, wire_topic, key, payload, headers)
    SELECT nextval('relay.delivery_id_seq'), e.eid, e.seq, now(), coalesce(_publish_rows.not_before, now()),
           r.hid, 0, CASE WHEN e.key IS NULL THEN e.eid % 64 ELSE relay.lane_of(e.key) END,
           _publish_rows.priority, _publish_rows.topic, r.wire, e.key, e.p, _publish_rows.headers
      FROM unnest(eids, coalesce(seqs, '{}'), keys, payloads) WITH ORDINALITY AS e(eid, seq, key, p, o),
           unnest(hids, wires) AS r(hid, wire)
     ORDER BY e.o, r.hid;
    IF NOT ('pull' = ALL (kinds)) THEN
        PERFORM relay._wake(hids, kinds);
    END IF;
    RETURN eids;
END
$$;

-- One event, the statements of _publish_rows without its arrays (the cost of
-- a single relay_publish is mostly statement overhead).
CREATE FUNCTION relay._publish_one(topic text, payload jsonb, key text, headers jsonb,
                                   priority integer, not_before timestamptz)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    hids  integer[];
    wires text[];
    kinds text[];
    key_seq bigint;
    eid   bigint;
    lane  integer;
BEGIN
    LOCK TABLE relay.deliveries IN ROW EXCLUSIVE MODE;
    -- The matching routes without sorting them: when they name one handler
    -- (most topics) that is the answer, and only several are resolved by
    -- _routes_for's rule (a sort and a DISTINCT cost about a quarter of the
    -- publish).
    SELECT array_agg(r.handler_id), array_agg(r.wire_name),
           array_agg((SELECT h.kind FROM relay.handlers h WHERE h.id = r.handler_id))
      INTO hids, wires, kinds
      FROM relay.routes r
     WHERE r.pattern = _publish_one.topic
        OR (r.pattern ~ '[*#]' AND '.' || _publish_one.topic ~ relay._pattern_regex(r.pattern));
    IF cardinality(hids) > 1 THEN
        SELECT array_agg(r.handler_id ORDER BY r.handler_id), array_agg(r.wire_name ORDER BY r.handler_id),
               array_agg(r.kind ORDER BY r.handler_id)
          INTO hids, wires, kinds
          FROM relay._routes_for(_publish_one.topic) r;
    END IF;
    IF hids IS NULL THEN
        RETURN nextval('relay.event_id_seq');
    END IF;
    IF _publish_one.key IS NOT NULL THEN
        INSERT INTO relay.key_seqs AS k (key, seq) VALUES (_publish_one.key, 1)
            ON CONFLICT (key) DO UPDATE SET seq = k.seq + 1
        RETURNING k.seq INTO key_seq;
    END IF;
    eid := nextval('relay.event_id_seq');
    lane := CASE WHEN _publish_one.key IS NULL THEN eid % 64 ELSE relay.lane_of(_publish_one.key) END;
    -- A row at a time: an INSERT ... VALUES starts faster than one over unnest.
    FOR i IN 1 .. cardinality(hids) LOOP
        INSERT INTO relay.deliveries (id, event_id, seq, published_at, not_before, handler_id, attempt,
                                      lane, priority, topic, wire_topic, key, payload, headers)
        VALUES (nextval('relay.delivery_id_seq'), eid, key_seq, now(), coalesce(_publish_one.not_before, now()),
                hids[i], 0, lane, _publish_one.priority, _publish_one.topic, wires[i], _publish_one.key,
                _publish_one.payload, _publish_one.headers);
    END LOOP;
    IF NOT ('pull' = ALL (kinds)) THEN
        PERFORM relay._wake(hids, kinds);
    END IF;
    RETURN eid;
END
$$;

-- Agents listen on relaybus; NOTIFY folds repeats within a transaction, so
-- this is one message per handler (but pull ones) per transaction.
CREATE FUNCTION relay._wake(hids integer[], kinds text[]) RETURNS void
LANGUAGE sql VOLATILE AS $$
    SELECT pg_notify('relaybus', h::text) FROM unnest(hids, kinds) AS t(h, k) WHERE k <> 'pull'
$$;

-- Under the dedupe key's transaction lock (its holder before this one has
-- ended): the event a live row names, if any.
CREATE FUNCTION relay._dedupe_find(key text) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT d.event_id FROM relay.dedupe d WHERE d.key = _dedupe_find.key AND d.expires_at > now()
$$;

CREATE FUNCTION relay._dedupe_record(key text, event_id bigint) RETURNS void
LANGUAGE sql VOLATILE AS $$
    INSERT INTO relay.dedupe AS d (key, event_id, expires_at)
    VALUES (_dedupe_record.key, _dedupe_record.event_id,
            now() + relay._setting('dedupe_window', 's', 86400, 1, 2147483647) * interval '1 second')
    ON CONFLICT (key) DO UPDATE SET event_id = excluded.event_id, expires_at = excluded.expires_at
$$;

-- W3C Trace Context (docs/tracing.md), the rules of src/core/trace_context.cpp.
CREATE FUNCTION relay._traceparent_ok(v text) RETURNS boolean
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(v ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-.*)?$'
                    AND left(v, 2) <> 'ff' AND (left(v, 2) <> '00' OR length(v) = 55)
                    AND substr(v, 4, 32) <> repeat('0', 32) AND substr(v, 37, 16) <> repeat('0', 16), false)
$$;

CREATE FUNCTION relay._tracestate_ok(v text) RETURNS boolean
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT v IS NOT NULL AND length(v) <= 512 AND coalesce(
        (SELECT count(*) <= 32
                AND bool_and(m ~ '^([a-z][a-z0-9_*/-]{0,255}|[a-z0-9][a-z0-9_*/-]{0,240}@[a-z][a-z0-9_*/-]{0,13})=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]$')
                AND count(DISTINCT split_part(m, '=', 1)) = count(*)
           FROM (SELECT btrim(x, E' \t') AS m FROM regexp_split_to_table(v, ',') AS x) s
          WHERE m <> ''), true)
$$;

-- sqlcommenter's URL-encoding (and \' escapes) undone.
CREATE FUNCTION relay._url_decode(v text) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(string_agg(CASE WHEN m[1] IS NOT NULL THEN chr(('x' || m[1])::bit(8)::integer)
                                    WHEN length(m[2]) = 2 THEN right(m[2], 1) ELSE m[2] END, '' ORDER BY o), '')
      FROM regexp_matches(v, '%([0-9A-Fa-f]{2})|(\\.|.)', 'g') WITH ORDINALITY AS t(m, o)
$$;

CREATE FUNCTION relay._trace_warning(what text, source text, value text) RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF what = 'traceparent' THEN
        RAISE WARNING 'ignoring a malformed traceparent from %', source
            USING DETAIL = format('"%s" is not a W3C Trace Context traceparent; the event is published without one.',
                                  coalesce(left(value, 80), '(not a string)'));
    ELSE
        RAISE WARNING 'ignoring a malformed tracestate from %', source
            USING DETAIL = 'A tracestate is at most 512 characters and 32 key=value members; the event is '
                           'published with its traceparent only.';
    END IF;
END
$$;

-- The publish's headers with its trace context: a valid traceparent of the
-- headers argument, else relaybus.traceparent (SET LOCAL), else a
-- sqlcommenter comment in the last 4 kB of current_query(); a malformed value
-- left out with a WARNING (the extension's publish_trace_context).
CREATE FUNCTION relay._trace_headers(headers jsonb) RETURNS jsonb
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    tp   text;
    ts   text;
    src  text;
    q    text;
    body text;
BEGIN
    IF headers ? 'traceparent' THEN
        IF jsonb_typeof(headers -> 'traceparent') = 'string' AND relay._traceparent_ok(headers ->> 'traceparent') THEN
            IF headers ? 'tracestate' AND NOT (jsonb_typeof(headers -> 'tracestate') = 'string'
                                                AND relay._tracestate_ok(headers ->> 'tracestate')) THEN
                PERFORM relay._trace_warning('tracestate', 'headers', NULL);
                RETURN headers - 'tracestate';
            END IF;
            RETURN headers;
        END IF;
        PERFORM relay._trace_warning('traceparent', 'headers',
                                     CASE WHEN jsonb_typeof(headers -> 'traceparent') = 'string'
                                          THEN headers ->> 'traceparent' END);
        headers := headers - 'traceparent' - 'tracestate';
    END IF;
    tp := coalesce(current_setting('relaybus.traceparent', true), '');
    IF tp <> '' THEN
        IF relay._traceparent_ok(tp) THEN
            ts := coalesce(current_setting('relaybus.tracestate', true), '');
            src := 'relaybus.tracestate';
        ELSE
            PERFORM relay._trace_warning('traceparent', 'relaybus.traceparent', tp);
            tp := '';
        END IF;
    END IF;
    IF tp = '' THEN
        q := right(current_query(), 4096);
        IF q IS NULL OR strpos(q, 'traceparent') = 0 THEN
            RETURN headers;
        END IF;
        SELECT c[1] INTO body
          FROM regexp_matches(q, '/\*(.*?)\*/', 'g') WITH ORDINALITY AS x(c, o)
         WHERE c[1] ~ '(^|[, *])traceparent='''
         ORDER BY o DESC LIMIT 1;
        IF body IS NULL THEN
            RETURN headers;
        END IF;
        tp := relay._url_decode(substring(body FROM '(?:^|[, *])traceparent=''((?:[^''\\]|\\.)*)'''));
        ts := coalesce(relay._url_decode(substring(body FROM '(?:^|[, *])tracestate=''((?:[^''\\]|\\.)*)''')), '');
        src := 'a sqlcommenter comment';
        IF NOT relay._traceparent_ok(tp) THEN
            PERFORM relay._trace_warning('traceparent', src, tp);
            RETURN headers;
        END IF;
    END IF;
    IF ts <> '' AND NOT relay._tracestate_ok(ts) THEN
        PERFORM relay._trace_warning('tracestate', src, NULL);
        ts := '';
    END IF;
    RETURN coalesce(headers, '{}') - 'tracestate'
           || jsonb_build_object('traceparent', tp)
           || CASE WHEN ts <> '' THEN jsonb_build_object('tracestate', ts) ELSE '{}' END;
END
$$;

-- The traceparent a handover carries (relay_claim, NOTIFY): the stored one's
-- trace-id and flags, a new span id (never all zeros).
CREATE FUNCTION relay._handover_traceparent(headers jsonb) RETURNS text
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
    SELECT '00-' || substr(tp, 4, 32) || '-'
           || CASE WHEN s = repeat('0', 16) THEN '0000000000000001' ELSE s END || '-' || substr(tp, 54, 2)
      FROM (SELECT headers ->> 'traceparent' AS tp, left(md5(gen_random_uuid()::text), 16) AS s) x
     WHERE jsonb_typeof(headers -> 'traceparent') = 'string' AND relay._traceparent_ok(tp)
$$;

CREATE FUNCTION relay_publish(topic text, payload jsonb, key text DEFAULT NULL,
                              headers jsonb DEFAULT NULL, priority integer DEFAULT 1,
                              not_before timestamptz DEFAULT NULL, dedupe_key text DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    earlier bigint;
    id      bigint;
BEGIN
    -- Arguments every check below would pass, with the settings at their
    -- defaults, in one expression (the checks' calls cost a tenth of a
    -- publish); otherwise the checks run, in their order, and name the first
    -- that fails. [.] rather than \., which standard_conforming_strings = off
    -- would read as any character.
    IF NOT coalesce(relay_publish.payload IS NOT NULL
                    AND relay_publish.priority BETWEEN 0 AND 3
                    AND octet_length(relay_publish.topic) <= 255
                    AND relay_publish.topic ~ '^[A-Za-z0-9_-]+([.][A-Za-z0-9_-]+)*$'
                    AND (relay_publish.headers IS NULL OR jsonb_typeof(relay_publish.headers) = 'object')
                    AND (relay_publish.not_before IS NULL OR isfinite(relay_publish.not_before))
                    AND (relay_publish.key IS NULL OR octet_length(relay_publish.key) BETWEEN 1 AND 512)
                    AND (relay_publish.dedupe_key IS NULL OR octet_length(relay_publish.dedupe_key) <= 512)
                    AND pg_column_size(relay_publish.payload) <= 1048576 + 4
                    AND coalesce(current_setting('relaybus.max_payload_bytes', true), '') = ''
                    AND coalesce(current_setting('relaybus.max_key_bytes', true), '') = ''
                    AND current_setting('transaction_read_only') = 'off', false) THEN
        PERFORM relay._check_publish('relay_publish', relay_publish.topic, relay_publish.headers,
                                     relay_publish.priority, relay_publish.not_before);
        IF relay_publish.payload IS NULL THEN
            RAISE EXCEPTION 'payload must not be NULL' USING ERRCODE = 'null_value_not_allowed';
        END IF;
        PERFORM relay._check_payload(relay_publish.payload, NULL);
        IF relay_publish.key IS NOT NULL THEN
            PERFORM relay._check_key('key', relay_publish.key, NULL);
        END IF;
        IF relay_publish.dedupe_key IS NOT NULL THEN
            PERFORM relay._check_key('dedupe_key', relay_publish.dedupe_key, NULL);
        END IF;
    END IF;
    IF relay_publish.dedupe_key IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(hashtextextended(relay_publish.dedupe_key, 4));
        earlier := relay._dedupe_find(relay_publish.dedupe_key);
        IF earlier IS NOT NULL THEN
            RETURN earlier;
        END IF;
    END IF;
    id := relay._publish_one(relay_publish.topic, relay_publish.payload, relay_publish.key,
                             CASE WHEN relay_publish.headers ? 'traceparent'
                                       OR coalesce(current_setting('relaybus.traceparent', true), '') <> ''
                                       OR strpos(right(current_query(), 4096), 'traceparent') > 0
                                  THEN relay._trace_headers(relay_publish.headers)
                                  ELSE relay_publish.headers END,
                             relay_publish.priority, relay_publish.not_before);
    IF relay_publish.dedupe_key IS NOT NULL THEN
        PERFORM relay._dedupe_record(relay_publish.dedupe_key, id);
    END IF;
    RETURN id;
END
$$;

-- A batch's keys or dedupe_keys (what: 'key' or 'dedupe_key'), subscripts
-- from 1, checked against payloads' count n and element by element.
CREATE FUNCTION relay._batch_keys(what text, keys text[], n integer)
RETURNS text[] LANGUAGE plpgsql STABLE AS $$
DECLARE
    k   text[];
    bad integer;
    lim integer;
BEGIN
    IF keys IS NULL THEN
        RETURN NULL;
    END IF;
    IF array_ndims(keys) > 1 THEN
        RAISE EXCEPTION '%s must be a one-dimensional array', what USING ERRCODE = 'array_subscript_error';
    END IF;
    k := CASE WHEN array_lower(keys, 1) = 1 THEN keys
              ELSE ARRAY(SELECT x FROM unnest(keys) WITH ORDINALITY AS t(x, o) ORDER BY o) END;
    IF cardinality(k) <> n THEN
        RAISE EXCEPTION '%s must have as many elements as payloads', what
            USING ERRCODE = 'array_subscript_error', DETAIL = n || ' payloads, ' || cardinality(k) || ' ' || what || 's.';
    END IF;
    -- Read only when a key is there to check, as _check_key reads it.
    IF cardinality(array_remove(k, NULL)) > 0 THEN
        lim := relay._setting('max_key_bytes', 'B', 512, 1, 2048);
    END IF;
    -- The first key _check_key would refuse, in one statement; it words the error.
    SELECT t.o::integer INTO bad FROM unnest(k) WITH ORDINALITY AS t(x, o)
     WHERE octet_length(t.x) > lim OR (what = 'key' AND t.x = '')
     ORDER BY t.o LIMIT 1;
    IF bad IS NOT NULL THEN
        PERFORM relay._check_key(what, k[bad], bad);
    END IF;
    RETURN k;
END
$$;

CREATE FUNCTION relay_publish_batch(topic text, payloads jsonb[], keys text[] DEFAULT NULL,
                                    headers jsonb DEFAULT NULL, priority integer DEFAULT 1,
                                    not_before timestamptz DEFAULT NULL, dedupe_keys text[] DEFAULT NULL)
RETURNS bigint[] LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n     integer;
    p     jsonb[];
    k     text[];
    dk    text[];
    first integer[];
    ids   bigint[];
    kept  integer[];
    eids  bigint[];
    bad   integer;
    lim   bigint;
BEGIN
    PERFORM relay._check_publish('relay_publish_batch', relay_publish_batch.topic, relay_publish_batch.headers,
                                 relay_publish_batch.priority, relay_publish_batch.not_before);
    relay_publish_batch.headers := relay._trace_headers(relay_publish_batch.headers);
    IF payloads IS NULL THEN
        RAISE EXCEPTION 'payloads must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF array_ndims(payloads) > 1 THEN
        RAISE EXCEPTION 'payloads must be a one-dimensional array' USING ERRCODE = 'array_subscript_error';
    END IF;
    -- Subscripts from 1, whatever the caller's lower bound (copied only when
    -- it is not 1).
    p := CASE WHEN array_lower(payloads, 1) = 1 THEN payloads
              ELSE ARRAY(SELECT x FROM unnest(payloads) WITH ORDINALITY AS t(x, o) ORDER BY o) END;
    n := cardinality(p);
    IF n > 10000 THEN
        RAISE EXCEPTION 'too many events in one batch: %', n
            USING ERRCODE = 'program_limit_exceeded', DETAIL = 'relay_publish_batch takes at most 10000 events per call.';
    END IF;
    -- The first payload that is NULL or too large, in one statement (a check
    -- per element was most of a batch's cost); _check_payload words the error.
    -- The setting is read where the first element's check would read it.
    IF n > 0 AND p[1] IS NOT NULL THEN
        lim := relay._setting('max_payload_bytes', 'B', 1048576, 1, 1073741823);
    END IF;
    SELECT t.o::integer INTO bad FROM unnest(p) WITH ORDINALITY AS t(x, o)
     WHERE t.x IS NULL OR pg_column_size(t.x) - 4 > lim
     ORDER BY t.o LIMIT 1;
    IF bad IS NOT NULL THEN
        IF p[bad] IS NULL THEN
            RAISE EXCEPTION 'payloads[%] must not be NULL', bad USING ERRCODE = 'null_value_not_allowed';
        END IF;
        PERFORM relay._check_payload(p[bad], bad);
    END IF;
    k := coalesce(relay._batch_keys('key', keys, n), array_fill(NULL::text, ARRAY[n]));
    IF n = 0 THEN
        RETURN '{}'::bigint[];
    END IF;
    IF dedupe_keys IS NULL THEN
        RETURN relay._publish_rows(relay_publish_batch.topic, p, k, relay_publish_batch.headers,
                                   relay_publish_batch.priority, relay_publish_batch.not_before);
    END IF;

    ids := array_fill(NULL::bigint, ARRAY[n]);
    kept := ARRAY(SELECT generate_series(1, n));
    IF dedupe_keys IS NOT NULL THEN
        dk := relay._batch_keys('dedupe_key', dedupe_keys, n);
        -- The keys' locks in hash order, so two batches never deadlock on them.
        PERFORM pg_advisory_xact_lock(h.h)
           FROM (SELECT DISTINCT hashtextextended(x, 4) AS h FROM unnest(dk) AS x WHERE x IS NOT NULL ORDER BY 1) h;
        -- A repeat of a key earlier in the batch gets that event's id; a key
        -- naming an earlier event gets that one's.
        first := ARRAY(SELECT CASE WHEN t.x IS NULL THEN t.o ELSE min(t.o) OVER (PARTITION BY t.x) END
                         FROM unnest(dk) WITH ORDINALITY AS t(x, o) ORDER BY t.o);
        FOR i IN 1 .. n LOOP
            IF dk[i] IS NOT NULL AND first[i] = i THEN
                ids[i] := relay._dedupe_find(dk[i]);
            END IF;
        END LOOP;
        kept := ARRAY(SELECT i FROM generate_series(1, n) AS i WHERE first[i] = i AND ids[i] IS NULL ORDER BY i);
    END IF;

    IF cardinality(kept) > 0 THEN
        eids := relay._publish_rows(relay_publish_batch.topic,
                                    ARRAY(SELECT p[i] FROM unnest(kept) WITH ORDINALITY AS t(i, o) ORDER BY o),
                                    ARRAY(SELECT k[i] FROM unnest(kept) WITH ORDINALITY AS t(i, o) ORDER BY o),
                                    relay_publish_batch.headers, relay_publish_batch.priority,
                                    relay_publish_batch.not_before);
        FOR j IN 1 .. cardinality(kept) LOOP
            ids[kept[j]] := eids[j];
            IF dk IS NOT NULL AND dk[kept[j]] IS NOT NULL THEN
                PERFORM relay._dedupe_record(dk[kept[j]], eids[j]);
            END IF;
        END LOOP;
    END IF;
    IF dk IS NULL THEN
        RETURN ids;
    END IF;
    RETURN ARRAY(SELECT ids[first[i]] FROM generate_series(1, n) AS i ORDER BY i);
END
$$;
