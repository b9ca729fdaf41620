-- relay_nack: retry with exponential backoff and full jitter, attempts, dead
-- letters after max_attempts; relay_replay puts a dead letter back as the head
-- of its key.
--
-- Note: the file runs in one transaction, and a nack gives its lease back only
-- when its transaction commits, so claims here use short leases and wait for
-- them to lapse where needed.
BEGIN;
SELECT plan(37);
SET LOCAL relaybus.priority_aging = 0;

CREATE FUNCTION pg_temp.id_of(n int) RETURNS bigint LANGUAGE sql AS $$
    SELECT id FROM relay.deliveries WHERE payload = jsonb_build_object('tap_r', n)
$$;
-- Claims and returns "key:seq:attempt" in hand-over order.
CREATE FUNCTION pg_temp.claim(handler text, per_key int DEFAULT 1)
RETURNS SETOF text LANGUAGE sql AS $$
    SELECT c.key || ':' || c.seq || ':' || c.attempt FROM relay_claim(handler, 100, '1s', per_key) c
$$;

-- ---------------------------------------------------------------- retry, dead, replay
SELECT relay_create_handler('tap_r1', 'pull', NULL,
                            '{"max_attempts": 3, "backoff_base": "1d", "backoff_max": "1d"}');
SELECT relay_route('tap.r1', 'tap_r1');
SELECT relay_publish('tap.r1', jsonb_build_object('tap_r', i), k)
  FROM unnest(ARRAY['tap-R', 'tap-R', 'tap-S']) WITH ORDINALITY AS t(k, i);
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_r1')$$, ARRAY['tap-R:1:1', 'tap-S:1:1'],
                  'first delivery: attempt 1');
SELECT is(relay_ack(ARRAY[pg_temp.id_of(3)]), 1, 'ack S1');

SELECT clock_timestamp() AS t0 \gset
SELECT is(relay_nack(pg_temp.id_of(1), 'boom 1'), 'retry', 'first failure: retry');
SELECT clock_timestamp() AS t1 \gset
SELECT results_eq(format($$SELECT attempt, last_error FROM relay.deliveries WHERE id = %s$$, pg_temp.id_of(1)),
                  $$VALUES (1, 'boom 1')$$, 'the failure is counted and its error kept');
SELECT ok((SELECT not_before > clock_timestamp() FROM relay.deliveries WHERE id = pg_temp.id_of(1)),
          'backoff: not_before is in the future');
SELECT ok((SELECT not_before BETWEEN :'t0'::timestamptz AND :'t1'::timestamptz + interval '1 day'
             FROM relay.deliveries WHERE id = pg_temp.id_of(1)),
          'backoff: at most backoff_base (1 day) for the first failure');
SELECT results_eq($$SELECT pending, retrying, delayed FROM relay.handler_stats WHERE handler = 'tap_r1'$$,
                  $$VALUES (2::bigint, 1::bigint, 1::bigint)$$, 'handler_stats counts it as retrying and delayed');
SELECT pg_sleep(1.1);  -- the 1s lease of the first claim lapses
SELECT is_empty($$SELECT * FROM pg_temp.claim('tap_r1', 10)$$,
                'while backing off it is not claimable, and R2 waits behind it');

SELECT is(relay_nack(pg_temp.id_of(1), 'boom 2', '0s'), 'retry', 'a nack with retry_in 0s');
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_r1')$$, ARRAY['tap-R:1:3'],
                  'claimable again at once; attempt 3 after two failures');
SELECT is(relay_nack(pg_temp.id_of(1), 'boom 3'), 'dead', 'the third failure (max_attempts 3): dead');
SELECT is((SELECT count(*) FROM relay.deliveries WHERE payload = '{"tap_r": 1}'), 0::bigint,
          'the delivery is gone');
SELECT results_eq($$SELECT handler, topic, key, seq, attempts, last_error, payload, last_status
                      FROM relay.dead_letters WHERE handler = 'tap_r1'$$,
                  $$VALUES ('tap_r1', 'tap.r1', 'tap-R', 1::bigint, 3, 'boom 3', '{"tap_r": 1}'::jsonb, NULL::int)$$,
                  'the dead letter keeps the event, the attempts and the last error');
SELECT results_eq($$SELECT pending, retrying, dead FROM relay.handler_stats WHERE handler = 'tap_r1'$$,
                  $$VALUES (1::bigint, 0::bigint, 1::bigint)$$, 'handler_stats counts the dead letter');
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_r1')$$, ARRAY['tap-R:2:1'],
                  'the dead letter releases its key: R2 is next');
SELECT is(relay_ack(ARRAY[pg_temp.id_of(2)]), 1, 'ack R2');
SELECT relay_publish('tap.r1', '{"tap_r": 4}', 'tap-R');

SELECT id AS dead_id FROM relay.dead_letters WHERE handler = 'tap_r1' \gset
SELECT is(relay_replay('tap_r1'), 1, 'replay the handler''s dead letters: one');
SELECT is_empty($$SELECT * FROM relay.dead_letters WHERE handler = 'tap_r1'$$, 'no dead letter left');
SELECT results_eq(format($$SELECT id, key, seq, attempt, last_error FROM relay.deliveries WHERE payload = '{"tap_r": 1}'$$),
                  format($$VALUES (%s::bigint, 'tap-R', 1::bigint, 0, NULL::text)$$, :dead_id),
                  'replayed with its delivery id and seq, a fresh attempt count and no error');
SELECT pg_sleep(1.1);  -- the lease of its last claim lapses
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_r1')$$, ARRAY['tap-R:1:1'],
                  'the replayed delivery is the head of its key again (before R3), attempt 1');
SELECT is(relay_ack(ARRAY[pg_temp.id_of(1)]), 1, 'ack R1');
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_r1')$$, ARRAY['tap-R:3:1'], 'then R3');

-- ---------------------------------------------------------------- max_attempts 1, NULL error, replay by id
SELECT relay_create_handler('tap_r2', 'pull', NULL, '{"max_attempts": 1}');
SELECT relay_route('tap.r2', 'tap_r2');
SELECT relay_publish('tap.r2', jsonb_build_object('tap_r', i), 'tap-T') FROM generate_series(5, 7) i;
SELECT is(relay_nack((SELECT id FROM relay_claim('tap_r2', 1))), 'dead', 'max_attempts 1: the first failure is final');
SELECT is(relay_nack((SELECT id FROM relay_claim('tap_r2', 1)), 'also dead'), 'dead', 'and the next one');
SELECT results_eq($$SELECT seq, attempts, last_error FROM relay.dead_letters WHERE handler = 'tap_r2' ORDER BY seq$$,
                  $$VALUES (1::bigint, 1, NULL::text), (2::bigint, 1, 'also dead')$$,
                  'a nack without an error keeps last_error NULL');
SELECT is(relay_replay('tap_r2', array(SELECT id FROM relay.dead_letters WHERE seq = 2 AND handler = 'tap_r2')),
          1, 'replay one dead letter by id');
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_r2', 10)$$, ARRAY['tap-T:2:1', 'tap-T:3:1'],
                  'T2 and T3 in order; T1 stays dead');
SELECT is(relay_replay(NULL, NULL), 1, 'replay everything: the one left');
SELECT is((SELECT count(*) FROM relay.dead_letters WHERE handler LIKE 'tap\_r%'), 0::bigint, 'no dead letters left');

-- ---------------------------------------------------------------- backoff bounds and jitter
-- backoff_base 1s, backoff_max 4s: the delay after failure k is uniform in
-- [0, min(1s * 2^(k-1), 4s)].
SELECT relay_create_handler('tap_r3', 'pull', NULL,
                            '{"max_attempts": 100, "backoff_base": "1s", "backoff_max": "4s"}');
SELECT relay_route('tap.r3', 'tap_r3');
SELECT relay_publish_batch('tap.r3', array_fill('{}'::jsonb, ARRAY[64]));
CREATE TEMP TABLE tap_delays (failure int, delay interval);
CREATE FUNCTION pg_temp.fail_all(failure int) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz := clock_timestamp();
BEGIN
    -- Only a lease's holder completes a delivery: claim them all first, at
    -- once rather than after each backoff (the test may write the table).
    UPDATE relay.deliveries d SET not_before = t0 - interval '1s' FROM relay.handlers h
     WHERE h.id = d.handler_id AND h.name = 'tap_r3';
    PERFORM relay_nack(c.id) FROM relay_claim('tap_r3', 100) c;
    INSERT INTO tap_delays
    SELECT failure, d.not_before - t0 FROM relay.deliveries d
      JOIN relay.handlers h ON h.id = d.handler_id WHERE h.name = 'tap_r3';
    -- How long the nacks took: a nack may have run that much after t0.
    INSERT INTO tap_delays VALUES (-failure, clock_timestamp() - t0);
END
$$;
SELECT pg_temp.fail_all(k) FROM generate_series(1, 4) k;
CREATE FUNCTION pg_temp.within(failure int, ceiling interval) RETURNS boolean LANGUAGE sql AS $$
    SELECT bool_and(d.delay >= interval '0' AND d.delay <= ceiling + s.delay)
      FROM tap_delays d, tap_delays s WHERE d.failure = within.failure AND s.failure = -within.failure
$$;
SELECT ok(pg_temp.within(1, '1s'), 'failure 1: delays within [0, 1s]');
SELECT ok(pg_temp.within(2, '2s'), 'failure 2: delays within [0, 2s]');
SELECT ok(pg_temp.within(3, '4s'), 'failure 3: delays within [0, 4s]');
SELECT ok(pg_temp.within(4, '4s'), 'failure 4: delays within [0, 4s] (backoff_max)');
SELECT ok((SELECT max(delay) > interval '1s' FROM tap_delays WHERE failure = 2),
          'failure 2: the ceiling has grown past 1s (some of 64 delays exceed it)');
SELECT ok((SELECT max(delay) > interval '2s' FROM tap_delays WHERE failure = 3),
          'failure 3: the ceiling has grown past 2s (some of 64 delays exceed it)');
SELECT ok((SELECT count(DISTINCT delay) > 32 FROM tap_delays WHERE failure = 4),
          'full jitter: the delays differ');
SELECT is((SELECT DISTINCT attempt FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id
            WHERE h.name = 'tap_r3'), 4, 'each delivery has 4 failed attempts');

SELECT * FROM finish();
ROLLBACK;
