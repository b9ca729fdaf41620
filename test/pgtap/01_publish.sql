-- Publishing: transactional outbox semantics, fan-out, routing patterns, wire
-- names, per-key seq.
BEGIN;
SELECT plan(46);

-- Deliveries of one event, by handler name.
CREATE FUNCTION pg_temp.handlers_of(event bigint) RETURNS SETOF text LANGUAGE sql AS $$
    SELECT h.name FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id
     WHERE d.event_id = event ORDER BY h.name
$$;
CREATE FUNCTION pg_temp.count_of(event bigint) RETURNS bigint LANGUAGE sql AS $$
    SELECT count(*) FROM relay.deliveries d WHERE d.event_id = event
$$;

-- ---------------------------------------------------------------- rollback
SELECT relay_create_handler('tap_one', 'pull');
SELECT relay_route('tap.one', 'tap_one');

SAVEPOINT before_publish;
SELECT relay_publish('tap.one', '{"n": 1}', 'tap-rb') AS ev \gset
SELECT is(pg_temp.count_of(:ev), 1::bigint, 'inside its transaction the publish wrote one delivery');
ROLLBACK TO SAVEPOINT before_publish;
SELECT is(pg_temp.count_of(:ev), 0::bigint, 'a rolled back publish leaves no delivery');
SELECT is((SELECT count(*) FROM relay.key_seqs WHERE key = 'tap-rb'), 0::bigint,
          'a rolled back publish leaves no key counter');
SELECT is_empty($$SELECT * FROM relay_claim('tap_one')$$, 'nothing to claim after the rollback');
SELECT is(relay_publish_batch('tap.one', ARRAY['{"n": 2}', '{"n": 3}']::jsonb[], ARRAY['tap-rb', 'tap-rb']) IS NOT NULL,
          true, 'a batch publish works after the rollback');
SELECT results_eq($$SELECT seq FROM relay.deliveries WHERE key = 'tap-rb' ORDER BY id$$,
                  ARRAY[1, 2]::bigint[], 'the rolled back event left no gap in seq');

-- ---------------------------------------------------------------- fan-out
SELECT relay_publish('tap.nobody', '{}') AS ev \gset
SELECT isnt(:ev::bigint, NULL::bigint, 'an unrouted publish still returns an event id');
SELECT is(pg_temp.count_of(:ev), 0::bigint, 'an unrouted topic creates no delivery');

SELECT relay_publish('tap.one', '{}') AS ev \gset
SELECT is(pg_temp.count_of(:ev), 1::bigint, 'one routed handler: one delivery');

-- Five handlers, routed by an exact topic, '*' and '#' patterns.
SELECT relay_create_handler('tap_f' || i, 'pull') FROM generate_series(1, 5) i;
SELECT relay_route('tap.fan.created', 'tap_f1');
SELECT relay_route('tap.fan.*', 'tap_f2');
SELECT relay_route('tap.#', 'tap_f3');
SELECT relay_route('#', 'tap_f4');
SELECT relay_route('*.fan.created', 'tap_f5');
SELECT relay_publish('tap.fan.created', '{"fan": 5}', 'tap-fan') AS ev \gset
SELECT is(pg_temp.count_of(:ev), 5::bigint, 'five routed handlers: five deliveries');
SELECT results_eq(format('SELECT * FROM pg_temp.handlers_of(%s)', :ev),
                  ARRAY['tap_f1', 'tap_f2', 'tap_f3', 'tap_f4', 'tap_f5'], 'one delivery per handler');
SELECT is((SELECT count(DISTINCT (payload, key, seq, topic)) FROM relay.deliveries WHERE event_id = :ev),
          1::bigint, 'every copy carries the same event (payload, key, seq, topic)');
SELECT is((SELECT count(*) FROM relay.deliveries WHERE event_id = :ev AND seq = 1), 5::bigint,
          'one event, one seq: every copy has seq 1');
SELECT is((SELECT count(DISTINCT id) FROM relay.deliveries WHERE event_id = :ev), 5::bigint,
          'each copy is a delivery of its own');
SELECT relay_publish_batch('tap.fan.created', ARRAY['{}', '{}', '{}']::jsonb[]) AS evs \gset
SELECT is((SELECT count(*) FROM relay.deliveries WHERE event_id = ANY (:'evs'::bigint[])), 15::bigint,
          'a batch of three events to five handlers: fifteen deliveries');
-- These catch-all routes would receive everything below.
SELECT relay_drop_handler('tap_f' || i, force => true) FROM generate_series(1, 5) i;

-- Pattern matching: '*' is exactly one segment, '#' zero or more.
SELECT relay_create_handler('tap_p_' || i, 'pull') FROM generate_series(1, 7) i;
SELECT relay_route('order.*', 'tap_p_1');
SELECT relay_route('order.#', 'tap_p_2');
SELECT relay_route('*', 'tap_p_3');
SELECT relay_route('*.*', 'tap_p_4');
SELECT relay_route('#.v2', 'tap_p_5');
SELECT relay_route('order.#.v2', 'tap_p_6');
SELECT relay_route('order.*.v2', 'tap_p_7');
-- Publishes one event and returns the tap_p_ handlers that got it.
CREATE FUNCTION pg_temp.matched(topic text) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    ev bigint := relay_publish(topic, '{}');
BEGIN
    RETURN QUERY SELECT h.name FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id
                  WHERE d.event_id = ev AND h.name LIKE 'tap\_p\_%' ORDER BY h.name;
END
$$;
SELECT results_eq($$SELECT * FROM pg_temp.matched('order')$$,
                  ARRAY['tap_p_2', 'tap_p_3'], 'order: order.# (zero segments) and *');
SELECT results_eq($$SELECT * FROM pg_temp.matched('order.created')$$,
                  ARRAY['tap_p_1', 'tap_p_2', 'tap_p_4'], 'order.created: order.*, order.#, *.*');
SELECT results_eq($$SELECT * FROM pg_temp.matched('order.created.v2')$$,
                  ARRAY['tap_p_2', 'tap_p_5', 'tap_p_6', 'tap_p_7'],
                  'order.created.v2: order.#, #.v2, order.#.v2, order.*.v2');
SELECT results_eq($$SELECT * FROM pg_temp.matched('order.v2')$$,
                  ARRAY['tap_p_1', 'tap_p_2', 'tap_p_4', 'tap_p_5', 'tap_p_6'],
                  'order.v2: order.*, order.#, *.*, #.v2, order.#.v2 (# as zero segments)');
SELECT results_eq($$SELECT * FROM pg_temp.matched('order.a.b.c.v2')$$,
                  ARRAY['tap_p_2', 'tap_p_5', 'tap_p_6'], 'order.a.b.c.v2: the # patterns');
SELECT results_eq($$SELECT * FROM pg_temp.matched('v2')$$,
                  ARRAY['tap_p_3', 'tap_p_5'], 'v2: * and #.v2');
SELECT results_eq($$SELECT * FROM pg_temp.matched('orders.created')$$, ARRAY['tap_p_4'],
                  'orders.created: only *.* (a segment matches whole, not as a prefix)');
SELECT results_eq($$SELECT * FROM pg_temp.matched('Order.created')$$, ARRAY['tap_p_4'],
                  'Order.created: only *.* (matching is case-sensitive)');
SELECT is_empty($$SELECT * FROM pg_temp.matched('other.a.b')$$, 'other.a.b: no pattern');

-- ---------------------------------------------------------------- wire names
-- One handler, several matching routes: one delivery; the most specific
-- route's wire name wins (exact topic, then fewer wildcards, where one '#'
-- outweighs any number of '*', then the alphabetically first pattern).
SELECT relay_create_handler('tap_w', 'pull');
SELECT relay_route('tap.w.created', 'tap_w', 'w.exact');
SELECT relay_route('tap.w.*', 'tap_w', 'w.star');
SELECT relay_route('*.w.*', 'tap_w', 'w.two-stars');
SELECT relay_route('tap.#', 'tap_w', 'w.hash');
SELECT relay_route('tap.w.#', 'tap_w', 'w.hash2');
SELECT relay_route('tap.w.plain', 'tap_w');
-- Publishes one event and returns the wire name of each delivery to tap_w.
CREATE FUNCTION pg_temp.wire(topic text) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    ev bigint := relay_publish(topic, '{}');
BEGIN
    RETURN QUERY SELECT coalesce(d.wire_topic, '<topic>') FROM relay.deliveries d
                   JOIN relay.handlers h ON h.id = d.handler_id
                  WHERE d.event_id = ev AND h.name = 'tap_w';
END
$$;
SELECT results_eq($$SELECT * FROM pg_temp.wire('tap.w.created')$$, ARRAY['w.exact'],
                  'five matching routes, one delivery: the exact route''s wire name');
SELECT results_eq($$SELECT * FROM pg_temp.wire('tap.w.other')$$, ARRAY['w.star'],
                  'one * beats two * and any #');
SELECT results_eq($$SELECT * FROM pg_temp.wire('x.w.other')$$, ARRAY['w.two-stars'],
                  'the only matching route');
SELECT results_eq($$SELECT * FROM pg_temp.wire('tap.w.a.b')$$, ARRAY['w.hash'],
                  'two # patterns: the alphabetically first (tap.# before tap.w.#)');
SELECT results_eq($$SELECT * FROM pg_temp.wire('tap.w.plain')$$, ARRAY['<topic>'],
                  'the most specific route has no wire name: the topic itself');
SELECT relay_route('tap.w.*', 'tap_w', 'w.star.v2');
SELECT results_eq($$SELECT * FROM pg_temp.wire('tap.w.other')$$, ARRAY['w.star.v2'],
                  'routing a pair again changes its wire name');
SELECT ok(relay_unroute('tap.w.created', 'tap_w'), 'unroute the exact route');
SELECT results_eq($$SELECT * FROM pg_temp.wire('tap.w.created')$$, ARRAY['w.star.v2'],
                  'without the exact route, the * route decides');
-- The consumer sees the wire name as the topic.
SELECT relay_publish('tap.w.other', '{"wire": true}') AS ev \gset
SELECT results_eq(format($$SELECT topic FROM relay_claim('tap_w', 1000) WHERE event_id = %s$$, :ev),
                  ARRAY['w.star.v2'], 'relay_claim hands over the wire name as topic');

SELECT relay_drop_handler('tap_w', force => true);

-- ---------------------------------------------------------------- seq
SELECT relay_create_handler('tap_seq', 'pull');
SELECT relay_route('tap.seq.#', 'tap_seq');
SELECT relay_publish(format('tap.seq.t%s', i % 3), jsonb_build_object('i', i), 'tap-s1')
  FROM generate_series(1, 10) i;
SELECT results_eq($$SELECT seq FROM relay.deliveries WHERE key = 'tap-s1' ORDER BY id$$,
                  $$SELECT generate_series(1, 10)::bigint$$, 'seq is 1..10 per key across topics');
SELECT results_eq($$SELECT (payload->>'i')::int FROM relay.deliveries WHERE key = 'tap-s1' ORDER BY seq$$,
                  $$SELECT generate_series(1, 10)$$, 'in publish order');
SELECT is((SELECT seq FROM relay.key_seqs WHERE key = 'tap-s1'), 10::bigint, 'the key counter is at 10');
SELECT relay_publish('tap.seq.x', '{"i": 11}', 'tap-s2');
SELECT is((SELECT seq FROM relay.deliveries WHERE key = 'tap-s2'), 1::bigint, 'another key starts at 1');
SELECT relay_publish('tap.seq.x', '{"i": 12}');
SELECT is((SELECT seq FROM relay.deliveries WHERE payload = '{"i": 12}'), NULL::bigint, 'an unkeyed event has no seq');

-- Batches: repeated keys take consecutive seqs in batch order and continue the counter.
SELECT relay_publish_batch('tap.seq.b', array(SELECT jsonb_build_object('b', i) FROM generate_series(1, 7) i),
                           ARRAY['tap-s1', 'tap-s3', 'tap-s1', 'tap-s1', NULL, 'tap-s3', 'tap-s2']) AS evs \gset
SELECT results_eq($$SELECT (payload->>'b')::int, key, seq FROM relay.deliveries
                     WHERE topic = 'tap.seq.b' ORDER BY (payload->>'b')::int$$,
                  $$VALUES (1, 'tap-s1', 11::bigint), (2, 'tap-s3', 1), (3, 'tap-s1', 12), (4, 'tap-s1', 13),
                           (5, NULL, NULL), (6, 'tap-s3', 2), (7, 'tap-s2', 2)$$,
                  'batch seqs: per key, in batch order, after the single publishes');
SELECT results_eq(format($$SELECT (payload->>'b')::int FROM relay.deliveries
                            WHERE event_id = ANY (%L::bigint[]) ORDER BY event_id$$, :'evs'),
                  $$SELECT generate_series(1, 7)$$, 'batch event ids follow the payload order');
SELECT relay_publish('tap.seq.x', '{"i": 13}', 'tap-s1');
SELECT is((SELECT seq FROM relay.deliveries WHERE payload = '{"i": 13}'), 14::bigint,
          'a single publish continues after the batch');
SELECT results_eq($$SELECT key, seq FROM relay.key_seqs WHERE key LIKE 'tap-s%' ORDER BY key$$,
                  $$VALUES ('tap-s1', 14::bigint), ('tap-s2', 2), ('tap-s3', 2)$$,
                  'the counters hold the last seq of each key');
SELECT is((SELECT bool_and(seq_rank = id_rank) FROM (
             SELECT rank() OVER (PARTITION BY key ORDER BY seq) AS seq_rank,
                    rank() OVER (PARTITION BY key ORDER BY id) AS id_rank
               FROM relay.deliveries WHERE key LIKE 'tap-s%') s), true,
          'within a key, delivery id order is seq order');
-- Claim hands a key over in seq order.
SELECT results_eq($$SELECT seq FROM relay_claim('tap_seq', 100, per_key => 100) WHERE key = 'tap-s1'$$,
                  $$SELECT generate_series(1, 14)::bigint$$, 'claim hands key tap-s1 over in seq order');

-- Lanes.
SELECT is((SELECT bool_and(lane = relay.lane_of(key)) FROM relay.deliveries WHERE key IS NOT NULL),
          true, 'a keyed delivery''s lane is relay.lane_of(key)');
SELECT is((SELECT bool_and(lane = event_id % 64) FROM relay.deliveries WHERE key IS NULL),
          true, 'an unkeyed delivery''s lane is its event id mod 64');

SELECT * FROM finish();
ROLLBACK;
