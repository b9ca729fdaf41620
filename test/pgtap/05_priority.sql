-- Priority classes 0..3: higher classes are claimed first across keys, never
-- within a key; with relaybus.priority_aging a waiting delivery gains one
-- class per aging period (counted from its not_before), so low classes are
-- not starved.
--
-- Deliveries published in one transaction share not_before = now() (the
-- transaction's start), so the aging tests set not_before from clock_timestamp().
BEGIN;
SELECT plan(11);

CREATE FUNCTION pg_temp.claim(handler text, max int DEFAULT 100, per_key int DEFAULT 1)
RETURNS SETOF int LANGUAGE sql AS $$
    SELECT (c.payload->>'n')::int FROM relay_claim(handler, max, NULL, per_key) c
$$;

-- ---------------------------------------------------------------- strict priority
SET LOCAL relaybus.priority_aging = 0;
SELECT relay_create_handler('tap_q1', 'pull');
SELECT relay_route('tap.q1', 'tap_q1');
SELECT relay_publish('tap.q1', jsonb_build_object('n', n), k, priority => p)
  FROM (VALUES (1, 'tap-A', 1), (2, 'tap-B', 3), (3, 'tap-C', 0), (4, NULL, 2),
               (5, 'tap-D', 3), (6, NULL, 1), (7, 'tap-E', 0)) AS t(n, k, p);
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_q1', 2)$$, ARRAY[2, 5],
                  'max 2: the two class 3 deliveries');
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_q1')$$, ARRAY[4, 1, 6, 3, 7],
                  'then class 2, class 1 and class 0, oldest first within a class');
SELECT is((SELECT array_agg(d.priority ORDER BY d.id) FROM relay.deliveries d JOIN relay.handlers h
            ON h.id = d.handler_id WHERE h.name = 'tap_q1'), ARRAY[1, 3, 0, 2, 3, 1, 0]::smallint[],
          'the deliveries keep their classes');

-- Priority never reorders a key.
SELECT relay_publish('tap.q1', '{"n": 8}', 'tap-F', priority => 0);
SELECT relay_publish('tap.q1', '{"n": 9}', 'tap-F', priority => 3);
SELECT relay_publish('tap.q1', '{"n": 10}', 'tap-G', priority => 2);
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_q1')$$, ARRAY[10, 8],
                  'F''s class 3 event waits behind its class 0 head; G (class 2) goes first');
SELECT relay_publish('tap.q1', '{"n": 11}', 'tap-H', priority => 0);
SELECT relay_publish('tap.q1', '{"n": 12}', 'tap-H', priority => 3);
SELECT relay_publish('tap.q1', '{"n": 13}', 'tap-I', priority => 2);
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_q1', per_key => 2)$$, ARRAY[13, 11, 12],
                  'per_key 2: H''s run comes in seq order, whatever its classes');

-- ---------------------------------------------------------------- aging
-- Two handlers get the same events; one is claimed with aging, one without.
SELECT relay_create_handler('tap_q2', 'pull');
SELECT relay_create_handler('tap_q3', 'pull');
SELECT relay_route('tap.q2', 'tap_q2');
SELECT relay_route('tap.q2', 'tap_q3');
SELECT relay_publish('tap.q2', '{"n": 20}', 'tap-J', priority => 1,
                     not_before => clock_timestamp() - interval '1.5 s');
SELECT relay_publish('tap.q2', '{"n": 21}', 'tap-K', priority => 3, not_before => clock_timestamp());
SELECT relay_publish('tap.q2', '{"n": 22}', 'tap-L', priority => 2, not_before => clock_timestamp());
SELECT relay_publish('tap.q2', '{"n": 23}', 'tap-M', priority => 0,
                     not_before => clock_timestamp() - interval '10 min');
SET LOCAL relaybus.priority_aging = '1s';
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_q2')$$, ARRAY[23, 21, 20, 22],
                  'aging 1s: M (class 0, waited 10 min) counts as 3 and is older than K; '
                  'J (class 1, waited 1.5s) counts as 2 and is older than L');
SET LOCAL relaybus.priority_aging = 0;
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_q3')$$, ARRAY[21, 22, 20, 23],
                  'aging off: strict classes 3, 2, 1, 0');

-- A delivery published earlier that waited a little beats a fresh class 3 one.
SET LOCAL relaybus.priority_aging = '50ms';
SELECT relay_create_handler('tap_q4', 'pull');
SELECT relay_route('tap.q4', 'tap_q4');
SELECT relay_publish('tap.q4', '{"n": 30}', 'tap-N', priority => 0, not_before => clock_timestamp());
SELECT pg_sleep(0.3);
SELECT relay_publish('tap.q4', '{"n": 31}', 'tap-O', priority => 3, not_before => clock_timestamp());
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_q4', 1)$$, ARRAY[30],
                  'aging 50ms: the class 0 delivery that waited 0.3s goes before a fresh class 3 one');
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_q4', 1)$$, ARRAY[31], 'then the class 3 one');
-- The same without aging: the fresh class 3 delivery goes first.
SET LOCAL relaybus.priority_aging = 0;
SELECT relay_publish('tap.q4', '{"n": 32}', 'tap-P', priority => 0, not_before => clock_timestamp());
SELECT pg_sleep(0.3);
SELECT relay_publish('tap.q4', '{"n": 33}', 'tap-Q', priority => 3, not_before => clock_timestamp());
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_q4', 1)$$, ARRAY[33],
                  'aging off: the fresh class 3 delivery goes first');
-- Aging never reorders a key either.
SET LOCAL relaybus.priority_aging = '1ms';
SELECT relay_publish('tap.q4', '{"n": 34}', 'tap-R', priority => 3, not_before => clock_timestamp() + interval '1 hour');
SELECT relay_publish('tap.q4', '{"n": 35}', 'tap-R', priority => 0, not_before => clock_timestamp() - interval '1 hour');
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_q4', per_key => 10)$$, ARRAY[32],
                  'an aged delivery still waits for its key''s delayed head (only P is ready)');

SELECT * FROM finish();
ROLLBACK;
