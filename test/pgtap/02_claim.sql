-- relay_claim: heads of keys (per_key 1), runs of a key (per_key N) in seq
-- order, a key's next delivery waits for the previous one, other keys are not
-- blocked by a leased, retrying or delayed key.
BEGIN;
SELECT plan(28);
SET LOCAL relaybus.priority_aging = 0;

-- Claims and returns "key:seq" (or "-:n" for unkeyed, n from the payload) in
-- hand-over order.
CREATE FUNCTION pg_temp.claim(handler text, max int DEFAULT 100, per_key int DEFAULT 1)
RETURNS SETOF text LANGUAGE sql AS $$
    SELECT coalesce(c.key || ':' || c.seq, '-:' || (c.payload->>'n'))
      FROM relay_claim(handler, max, NULL, per_key) c
$$;
CREATE FUNCTION pg_temp.id_of(k text, s bigint) RETURNS bigint LANGUAGE sql AS $$
    SELECT id FROM relay.deliveries WHERE key = k AND seq = s
$$;

-- ---------------------------------------------------------------- heads
SELECT relay_create_handler('tap_c1', 'pull');
SELECT relay_route('tap.c1', 'tap_c1');
SELECT is_empty($$SELECT * FROM pg_temp.claim('tap_c1')$$, 'no deliveries: an empty claim');
-- Interleaved: A1 B1 A2 U1 C1 A3 B2 U2
SELECT relay_publish('tap.c1', jsonb_build_object('n', i), k)
  FROM unnest(ARRAY['tap-A', 'tap-B', 'tap-A', NULL, 'tap-C', 'tap-A', 'tap-B', NULL]) WITH ORDINALITY AS t(k, i);
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_c1')$$,
                  ARRAY['tap-A:1', 'tap-B:1', '-:4', 'tap-C:1', '-:8'],
                  'per_key 1: the head of each key and the unkeyed deliveries, oldest first');
SELECT is_empty($$SELECT * FROM pg_temp.claim('tap_c1')$$,
                'the next deliveries of the keys wait for their leased heads');
SELECT is((SELECT in_flight FROM relay.handler_stats WHERE handler = 'tap_c1'), 5::bigint,
          'five deliveries in flight');
SELECT is(relay_ack(ARRAY[pg_temp.id_of('tap-B', 1)]), 1, 'ack B1');
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_c1')$$, ARRAY['tap-B:2'],
                  'B2 is claimable once B1 is acked; A2 still waits for A1');
SELECT is(relay_ack(ARRAY[pg_temp.id_of('tap-A', 1)]), 1, 'ack A1');
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_c1')$$, ARRAY['tap-A:2'], 'then A2, and only A2');
SELECT is_empty($$SELECT * FROM pg_temp.claim('tap_c1', per_key => 5)$$,
                'A3 waits for A2 even with per_key 5: A2 is leased by an earlier claim');
SELECT is(relay_ack(ARRAY[pg_temp.id_of('tap-A', 2)]), 1, 'ack A2');
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_c1')$$, ARRAY['tap-A:3'], 'then A3');

-- ---------------------------------------------------------------- runs
SELECT relay_create_handler('tap_c2', 'pull');
SELECT relay_route('tap.c2', 'tap_c2');
-- D1..D5, E1..E3, interleaved
SELECT relay_publish('tap.c2', jsonb_build_object('n', i), k)
  FROM unnest(ARRAY['tap-D', 'tap-E', 'tap-D', 'tap-D', 'tap-E', 'tap-D', 'tap-E', 'tap-D'])
       WITH ORDINALITY AS t(k, i);
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_c2', per_key => 3)$$,
                  ARRAY['tap-D:1', 'tap-D:2', 'tap-D:3', 'tap-E:1', 'tap-E:2', 'tap-E:3'],
                  'per_key 3: runs of up to three per key, each in seq order, key by key');
SELECT is_empty($$SELECT * FROM pg_temp.claim('tap_c2', per_key => 3)$$, 'D4 waits for the leased run');
SELECT is(relay_ack(ARRAY[pg_temp.id_of('tap-D', 1), pg_temp.id_of('tap-D', 2)]), 2, 'ack D1, D2');
SELECT is_empty($$SELECT * FROM pg_temp.claim('tap_c2', per_key => 3)$$, 'D4 still waits for D3');
SELECT is(relay_ack(ARRAY[pg_temp.id_of('tap-D', 3)]), 1, 'ack D3');
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_c2', per_key => 10)$$,
                  ARRAY['tap-D:4', 'tap-D:5'], 'then the rest of D in order');
-- max counts deliveries, not keys
SELECT relay_publish('tap.c2', jsonb_build_object('n', i), 'tap-F') FROM generate_series(1, 5) i;
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_c2', max => 2, per_key => 10)$$,
                  ARRAY['tap-F:1', 'tap-F:2'], 'max 2: two deliveries of a run');
SELECT is_empty($$SELECT * FROM pg_temp.claim('tap_c2', per_key => 10)$$,
                'F3 waits behind the leased F2');

-- ---------------------------------------------------------------- independence of keys
SELECT relay_create_handler('tap_c3', 'pull');
SELECT relay_route('tap.c3', 'tap_c3');
SELECT relay_publish('tap.c3', '{"n": 1}', 'tap-X');
SELECT relay_publish('tap.c3', '{"n": 2}', 'tap-X');
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_c3')$$, ARRAY['tap-X:1'], 'X1 is leased');
SELECT relay_publish('tap.c3', '{"n": 3}', 'tap-Y');
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_c3')$$, ARRAY['tap-Y:1'],
                  'Y1, published after, is not blocked by the leased key X');
SELECT is(relay_nack(pg_temp.id_of('tap-X', 1), 'failed', '1 hour'), 'retry', 'X1 fails: retry in an hour');
SELECT is(relay_ack(ARRAY[pg_temp.id_of('tap-Y', 1)]), 1, 'ack Y1');
SELECT relay_publish('tap.c3', '{"n": 4}', 'tap-Y');
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_c3', per_key => 10)$$, ARRAY['tap-Y:2'],
                  'Y2 is not blocked by the retrying key X; X2 is');

-- ---------------------------------------------------------------- delays
SELECT relay_create_handler('tap_c4', 'pull');
SELECT relay_route('tap.c4', 'tap_c4');
SELECT relay_publish('tap.c4', '{"n": 1}', 'tap-L', not_before => clock_timestamp() + interval '1 hour');
SELECT relay_publish('tap.c4', '{"n": 2}', 'tap-L');
SELECT relay_publish('tap.c4', '{"n": 3}', 'tap-M');
SELECT relay_publish('tap.c4', '{"n": 4}', NULL, not_before => clock_timestamp() + interval '1 hour');
SELECT relay_publish('tap.c4', '{"n": 5}', NULL, not_before => now() - interval '1 hour');
SELECT results_eq($$SELECT delayed, ready FROM relay.handler_stats WHERE handler = 'tap_c4'$$,
                  $$VALUES (2::bigint, 3::bigint)$$, 'handler_stats: 2 delayed, 3 ready');
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_c4', per_key => 10)$$, ARRAY['tap-M:1', '-:5'],
                  'a delayed delivery is not claimable and holds back its key (L2), not other keys');
SELECT is_empty($$SELECT * FROM pg_temp.claim('tap_c4', per_key => 10)$$, 'nothing else is ready');
-- The delay of a key's head is moved to the past: the key flows again.
UPDATE relay.deliveries SET not_before = now() - interval '1 second'
 WHERE id = pg_temp.id_of('tap-L', 1);
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_c4', per_key => 10)$$, ARRAY['tap-L:1', 'tap-L:2'],
                  'once the delay has passed, L1 and L2 in order');

SELECT * FROM finish();
ROLLBACK;
