-- W3C Trace Context (docs/tracing.md): what relay_publish records in an
-- event's headers (headers > SET LOCAL relaybus.traceparent > a sqlcommenter
-- comment), malformed values left out (the event still published, counted),
-- and relay_claim's traceparent: a new span of the stored trace per handover.
BEGIN;
SELECT plan(24);

SELECT relay_create_handler('tap_trace', 'pull');
SELECT relay_create_handler('tap_trace2', 'pull');
SELECT relay_route('tap.trace', 'tap_trace');
SELECT relay_route('tap.trace', 'tap_trace2');
CREATE FUNCTION pg_temp.headers_of(event bigint) RETURNS jsonb LANGUAGE sql AS $$
    SELECT DISTINCT d.headers FROM relay.deliveries d WHERE d.event_id = event
$$;
SELECT coalesce(relay._trace_context_ignored(), 0) AS ignored_before \gset
SET client_min_messages = error;

-- ---------------------------------------------------------------- headers
SELECT relay_publish('tap.trace', '{}', NULL,
                     '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",'
                     ' "tracestate": "congo=t61rcWkgMzE", "x": "y"}') AS ev \gset
SELECT is(pg_temp.headers_of(:ev),
          '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "congo=t61rcWkgMzE", "x": "y"}',
          'a valid traceparent and tracestate in headers are kept as they are');
SELECT relay_publish('tap.trace', '{}', NULL,
                     '{"traceparent": "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", "tracestate": "a=1", "x": 1}')
       AS ev \gset
SELECT is(pg_temp.headers_of(:ev), '{"x": 1}',
          'a malformed traceparent in headers is left out, with its tracestate; the event is published');
SELECT relay_publish('tap.trace', '{}', NULL,
                     '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "a=1,a=2"}')
       AS ev \gset
SELECT is(pg_temp.headers_of(:ev), '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}',
          'a malformed tracestate is left out, the traceparent kept');
SELECT relay_publish('tap.trace', '{}', NULL, '{"traceparent": 42}') AS ev \gset
SELECT is(pg_temp.headers_of(:ev), '{}', 'a traceparent that is not a string is left out');
SELECT relay_publish('tap.trace', '{}') AS ev \gset
SELECT is(pg_temp.headers_of(:ev), NULL, 'without any trace context the headers stay NULL');
SELECT relay_publish('tap.trace', '{}', NULL, '{"a": "b"}') AS ev \gset
SELECT is(pg_temp.headers_of(:ev), '{"a": "b"}', 'and other headers stay as they are');

-- ---------------------------------------------------------------- SET LOCAL
SAVEPOINT s;
SET LOCAL relaybus.traceparent = '00-11111111111111111111111111111111-2222222222222222-01';
SET LOCAL relaybus.tracestate = 'vendor=v1';
SELECT relay_publish('tap.trace', '{}') AS ev \gset
SELECT is(pg_temp.headers_of(:ev),
          '{"traceparent": "00-11111111111111111111111111111111-2222222222222222-01", "tracestate": "vendor=v1"}',
          'SET LOCAL relaybus.traceparent and relaybus.tracestate are recorded when headers carry none');
SELECT relay_publish('tap.trace', '{}', NULL, '{"k": 1, "tracestate": "old=1"}') AS ev \gset
SELECT is(pg_temp.headers_of(:ev),
          '{"k": 1, "traceparent": "00-11111111111111111111111111111111-2222222222222222-01", "tracestate": "vendor=v1"}',
          'joined to the other headers, the setting''s tracestate replacing a lone one');
SELECT relay_publish('tap.trace', '{}', NULL,
                     '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}') AS ev \gset
SELECT is(pg_temp.headers_of(:ev), '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}',
          'a valid traceparent in headers wins over the setting');
SELECT relay_publish('tap.trace', '{}', NULL,
                     '{"traceparent": "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}') AS ev \gset
SELECT is(pg_temp.headers_of(:ev)->>'traceparent', '00-11111111111111111111111111111111-2222222222222222-01',
          'a malformed one in headers falls back to the setting');
SELECT relay_publish('tap.trace', '{}') /*traceparent='00-33333333333333333333333333333333-4444444444444444-01'*/ AS ev \gset
SELECT is(pg_temp.headers_of(:ev)->>'traceparent', '00-11111111111111111111111111111111-2222222222222222-01',
          'the setting wins over a sqlcommenter comment');
SELECT relay_publish_batch('tap.trace', ARRAY['{}', '{}']::jsonb[]) AS evs \gset
SELECT is((SELECT count(DISTINCT d.headers->>'traceparent') FROM relay.deliveries d WHERE d.event_id = ANY (:'evs'::bigint[])
            AND d.headers->>'traceparent' = '00-11111111111111111111111111111111-2222222222222222-01'), 1::bigint,
          'relay_publish_batch records the setting with every event');
SET LOCAL relaybus.traceparent = '00-11111111111111111111111111111111-2222222222222222';
SET LOCAL relaybus.tracestate = '';
SELECT relay_publish('tap.trace', '{}') /*traceparent='00-33333333333333333333333333333333-4444444444444444-01'*/ AS ev \gset
SELECT is(pg_temp.headers_of(:ev), '{"traceparent": "00-33333333333333333333333333333333-4444444444444444-01"}',
          'a malformed setting falls back to the sqlcommenter comment');
ROLLBACK TO SAVEPOINT s;  -- ends the SET LOCALs

-- ---------------------------------------------------------------- sqlcommenter
SELECT relay_publish('tap.trace', '{}') /*action='x',traceparent='00-55555555555555555555555555555555-6666666666666666-01',tracestate='rojo%3D00f067aa0ba902b7%2Ccongo%3Dt61'*/ AS ev \gset
SELECT is(pg_temp.headers_of(:ev),
          '{"traceparent": "00-55555555555555555555555555555555-6666666666666666-01", "tracestate": "rojo=00f067aa0ba902b7,congo=t61"}',
          'a sqlcommenter comment of the statement is recorded, its values URL-decoded');
SELECT relay_publish('tap.trace', '{}') /*traceparent='00-55555555555555555555555555555555-0000000000000000-01'*/ AS ev \gset
SELECT is(pg_temp.headers_of(:ev), NULL, 'a malformed one is left out');
SELECT relay_publish('tap.trace', '{}', NULL, '{"note": "traceparent=''00-55555555555555555555555555555555-6666666666666666-01''"}') AS ev \gset
SELECT is(pg_temp.headers_of(:ev)->'traceparent', NULL, 'text outside a comment is not a sqlcommenter comment');
SELECT repeat('x', 5000) AS pad \gset
SELECT relay_publish('tap.trace', '{}', NULL, jsonb_build_object('pad', :'pad')) /*traceparent='00-55555555555555555555555555555555-6666666666666666-01'*/ AS ev \gset
SELECT is(pg_temp.headers_of(:ev)->>'traceparent', '00-55555555555555555555555555555555-6666666666666666-01',
          'a comment at the end of a long statement is found');
/*traceparent='00-55555555555555555555555555555555-6666666666666666-01'*/ SELECT relay_publish('tap.trace', '{}', NULL, jsonb_build_object('pad', :'pad')) AS ev \gset
SELECT is(pg_temp.headers_of(:ev)->'traceparent', NULL, 'only the last 4 kB of the statement are read');
SELECT count(*) AS n FROM (SELECT relay_publish('tap.trace', jsonb_build_object('rows', i)) FROM generate_series(1, 3) i) p /*traceparent='00-77777777777777777777777777777777-8888888888888888-01'*/ \gset
SELECT is((SELECT count(*) FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id
            WHERE h.name = 'tap_trace' AND d.payload ? 'rows'
              AND d.headers->>'traceparent' = '00-77777777777777777777777777777777-8888888888888888-01'), 3::bigint,
          'every publish of one statement carries its comment');
SELECT count(*) AS n FROM (SELECT relay_publish('tap.trace', jsonb_build_object('after', i)) FROM generate_series(1, 2) i) p \gset
SELECT is((SELECT count(*) FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id
            WHERE h.name = 'tap_trace' AND d.payload ? 'after' AND d.headers IS NULL), 2::bigint,
          'the next statement, without a comment, carries none');

-- ---------------------------------------------------------------- the counter
SELECT is(relay._trace_context_ignored() - :ignored_before, 6::bigint,
          'each malformed value left out is counted (relay._trace_context_ignored)');

-- ---------------------------------------------------------------- relay_claim
DELETE FROM relay.deliveries WHERE handler_id IN (SELECT id FROM relay.handlers WHERE name LIKE 'tap_trace%');
SELECT relay_publish('tap.trace', '{}', NULL,
                     '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}') AS ev \gset
SELECT relay_publish('tap.trace', '{}') AS plain \gset
CREATE TEMP TABLE claimed AS
    SELECT 1 AS h, * FROM relay_claim('tap_trace', 10) UNION ALL SELECT 2, * FROM relay_claim('tap_trace2', 10);
SELECT is((SELECT count(*) FROM claimed WHERE event_id = :ev
             AND traceparent ~ '^00-4bf92f3577b34da6a3ce929d0e0e4736-[0-9a-f]{16}-01$'
             AND traceparent <> '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'
             AND substr(traceparent, 37, 16) <> '0000000000000000'), 2::bigint,
          'relay_claim''s traceparent: the stored trace-id and flags, a span id of its own');
SELECT is((SELECT count(DISTINCT traceparent) FROM claimed WHERE event_id = :ev), 2::bigint,
          'each handover is a span of its own');
SELECT is((SELECT count(*) FROM claimed WHERE event_id = :plain AND traceparent IS NULL), 2::bigint,
          'an event without trace context is claimed with a NULL traceparent');

SELECT * FROM finish();
ROLLBACK;
