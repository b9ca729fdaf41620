-- Hot keys: when a claim's window is full of a few keys' runs, relay_claim
-- finds the heads of the other keys through deliveries_key, keeps per-key
-- order and leases, and still finds unkeyed deliveries behind the runs.
BEGIN;
SELECT plan(9);
SET LOCAL relaybus.priority_aging = 0;

CREATE FUNCTION pg_temp.claim(handler text, max int DEFAULT 100, per_key int DEFAULT 1)
RETURNS SETOF text LANGUAGE sql AS $$
    SELECT coalesce(c.key || ':' || c.seq, '-:' || (c.payload->>'n'))
      FROM relay_claim(handler, max, NULL, per_key) c
$$;
CREATE FUNCTION pg_temp.id_of(k text, s bigint) RETURNS bigint LANGUAGE sql AS $$
    SELECT id FROM relay.deliveries WHERE key = k AND seq = s
$$;
-- Claims `times` times (max 10, per_key 1) and returns everything claimed.
CREATE FUNCTION pg_temp.claims(handler text, times int) RETURNS SETOF text LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1..times LOOP
        RETURN QUERY SELECT * FROM pg_temp.claim(handler, 10);
    END LOOP;
END
$$;

SELECT relay_create_handler('tap_hot', 'pull');
SELECT relay_route('tap.hot', 'tap_hot');
-- 300 of tap-H, one of tap-J, one of tap-K, 300 of tap-L, one of tap-M.
SELECT relay_publish_batch('tap.hot', array_agg(jsonb_build_object('n', i)), array_agg('tap-H'::text))
  FROM generate_series(1, 300) i;
SELECT relay_publish('tap.hot', '{"n": 1}', 'tap-J');
SELECT relay_publish('tap.hot', '{"n": 1}', 'tap-K');
SELECT relay_publish_batch('tap.hot', array_agg(jsonb_build_object('n', i)), array_agg('tap-L'::text))
  FROM generate_series(1, 300) i;
SELECT relay_publish('tap.hot', '{"n": 1}', 'tap-M');

SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_hot', 10)$$,
                  ARRAY['tap-H:1', 'tap-J:1', 'tap-K:1', 'tap-L:1', 'tap-M:1'],
                  'per_key 1: the head of every key, oldest first, though the first 300 rows are one key''s run');
SELECT is_empty($$SELECT * FROM pg_temp.claim('tap_hot', 10)$$,
                'every head is leased: nothing more, the runs wait');
SELECT is(relay_ack(ARRAY[pg_temp.id_of('tap-H', 1), pg_temp.id_of('tap-L', 1)]), 2, 'ack H1 and L1');
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_hot', 10)$$, ARRAY['tap-H:2', 'tap-L:2'],
                  'then H2 and L2, and nothing of J, K, M (leased)');
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_hot', 10, 5)$$, ARRAY[]::text[],
                  'per_key 5: H and L wait behind their leased heads');
SELECT is(relay_ack(ARRAY[pg_temp.id_of('tap-H', 2)]), 1, 'ack H2');
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_hot', 100, 100)$$,
                  (SELECT array_agg('tap-H:' || s ORDER BY s) FROM generate_series(3, 102) s),
                  'per_key 100: one claim takes 100 of the hot key''s run, in seq order');

-- An unkeyed delivery behind both runs is found within a few claims.
SELECT relay_publish('tap.hot', '{"n": 42}');
SELECT is((SELECT count(*) FROM pg_temp.claims('tap_hot', 16) c WHERE c = '-:42'), 1::bigint,
          'the unkeyed delivery behind the runs is claimed within 16 claims');
SELECT is((SELECT count(*) FROM relay_claim('tap_hot', 10)), 0::bigint, 'and then nothing is left to claim');

SELECT * FROM finish();
ROLLBACK;
