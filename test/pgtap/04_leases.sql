-- Leases: a claimed delivery is leased in shared memory (clock time) until it
-- is completed by a committed ack/nack or the lease runs out; then the next
-- claim charges a failed attempt and, after the backoff, it is claimed again
-- (the only way a duplicate happens). The exactly-once pattern:
-- the consumer's writes and relay_ack commit or roll back together.
BEGIN;
SELECT plan(27);
SET LOCAL relaybus.priority_aging = 0;

CREATE FUNCTION pg_temp.id_of(n int) RETURNS bigint LANGUAGE sql AS $$
    SELECT id FROM relay.deliveries WHERE payload = jsonb_build_object('tap_l', n)
$$;

SELECT relay_create_handler('tap_l1', 'pull', NULL, '{"lease": "1s"}');
SELECT relay_create_handler('tap_l2', 'pull', NULL, '{"backoff_base": "1ms", "backoff_max": "1ms"}');
SELECT relay_route('tap.l1', 'tap_l1');
SELECT relay_route('tap.l2', 'tap_l2');

-- ---------------------------------------------------------------- expiry
SELECT relay_publish('tap.l2', jsonb_build_object('tap_l', 1), 'tap-L');
SELECT relay_publish('tap.l2', jsonb_build_object('tap_l', 2), 'tap-L');
SELECT results_eq($$SELECT id, attempt FROM relay_claim('tap_l2', lease => '1s')$$,
                  format('VALUES (%s::bigint, 1)', pg_temp.id_of(1)), 'claim L1 with a 1s lease');
SELECT results_eq($$SELECT delivery_id, owner_pid FROM relay._leases() l
                     JOIN relay.handlers h ON h.id = l.handler_id WHERE h.name = 'tap_l2'$$,
                  format('VALUES (%s::bigint, pg_backend_pid())', pg_temp.id_of(1)),
                  'the lease is in relay._leases(), owned by this backend');
SELECT ok((SELECT lease_until > clock_timestamp() AND lease_until <= clock_timestamp() + interval '1s'
             FROM relay._leases() WHERE delivery_id = pg_temp.id_of(1)), 'it runs out within 1s');
SELECT is((SELECT in_flight FROM relay.handler_stats WHERE handler = 'tap_l2'), 1::bigint, 'one in flight');
SELECT is_empty($$SELECT * FROM relay_claim('tap_l2', per_key => 10)$$,
                'while leased: neither L1 nor L2 can be claimed');
SELECT pg_sleep(1.1);
SELECT is((SELECT in_flight FROM relay.handler_stats WHERE handler = 'tap_l2'), 0::bigint,
          'after the lease ran out, nothing is in flight');
SELECT is_empty($$SELECT id, attempt FROM relay_claim('tap_l2', lease => '1s')$$,
                'the next claim charges the expired lease as a failed attempt and hands nothing over');
SELECT results_eq($$SELECT attempt, last_error FROM relay.deliveries WHERE id = pg_temp.id_of(1)$$,
                  $$VALUES (1, 'lease expired')$$, 'L1: attempt 1, last_error "lease expired"');
SELECT pg_sleep(0.01);
SELECT results_eq($$SELECT id, attempt FROM relay_claim('tap_l2', lease => '1s')$$,
                  format('VALUES (%s::bigint, 2)', pg_temp.id_of(1)),
                  'after its backoff (1ms) L1 is claimed again: same id, attempt 2');
-- The handler's lease option is the default lease.
SELECT relay_publish('tap.l1', jsonb_build_object('tap_l', 3));
SELECT ok((SELECT lease_until <= clock_timestamp() + interval '1s' FROM relay_claim('tap_l1')),
          'the handler''s lease option (1s) is the default');
SELECT relay_publish('tap.l1', jsonb_build_object('tap_l', 4));
SELECT ok((SELECT bool_and(lease_until > clock_timestamp() + interval '1 hour')
             FROM relay_claim('tap_l1', lease => '2 hours') WHERE payload = '{"tap_l": 4}'),
          'a lease passed to relay_claim overrides the option');

-- ---------------------------------------------------------------- completion releases at commit only
-- This file is one transaction: completions here never commit, so leases stay.
SELECT relay_publish('tap.l2', jsonb_build_object('tap_l', 5), 'tap-M');
SELECT results_eq($$SELECT key FROM relay_claim('tap_l2', lease => '1s') WHERE key = 'tap-M'$$,
                  ARRAY['tap-M'], 'claim M1');
SELECT is(relay_nack(pg_temp.id_of(5), 'x', '0s'), 'retry', 'nack M1 with retry_in 0s');
SELECT ok((SELECT count(*) = 1 FROM relay._leases() WHERE delivery_id = pg_temp.id_of(5)),
          'the lease is still there (other sessions cannot take M1 before the nack commits: isolation/ack_race)');
SELECT results_eq($$SELECT key, attempt FROM relay_claim('tap_l2') WHERE key = 'tap-M'$$, $$VALUES ('tap-M', 2)$$,
                  'the nacking transaction itself sees the nack done: it may claim M1 again (attempt 2)');

-- ---------------------------------------------------------------- exactly-once pattern
CREATE TEMP TABLE tap_done (n int PRIMARY KEY);
SELECT relay_publish('tap.l2', jsonb_build_object('tap_l', 6), 'tap-N');
SELECT relay_publish('tap.l2', jsonb_build_object('tap_l', 7), 'tap-N');
SELECT pg_temp.id_of(6) AS n1 \gset
SELECT results_eq($$SELECT (payload->>'tap_l')::int FROM relay_claim('tap_l2', lease => '1s') WHERE key = 'tap-N'$$,
                  ARRAY[6], 'a consumer claims N1');
SAVEPOINT work;
INSERT INTO tap_done VALUES (6);
SELECT is(relay_ack(ARRAY[pg_temp.id_of(6)]), 1, 'it does its work and acks N1 in the same transaction');
SELECT is_empty($$SELECT * FROM relay.deliveries WHERE payload = '{"tap_l": 6}'$$,
                'inside that transaction N1 is gone');
ROLLBACK TO SAVEPOINT work;
SELECT is_empty('SELECT * FROM tap_done', 'the transaction fails: its work is undone');
SELECT is((SELECT count(*) FROM relay.deliveries WHERE payload = '{"tap_l": 6}'), 1::bigint,
          '... and so is the ack: N1 is still pending');
SELECT is_empty($$SELECT * FROM relay_claim('tap_l2') WHERE key = 'tap-N'$$,
                'N1 keeps its lease: not claimable again yet, N2 still waits');
SELECT pg_sleep(1.1);
SELECT is_empty($$SELECT * FROM relay_claim('tap_l2') WHERE key = 'tap-N'$$,
                'after the lease, the next claim charges N1 a failed attempt ...');
SELECT pg_sleep(0.01);
SELECT results_eq($$SELECT (payload->>'tap_l')::int, attempt FROM relay_claim('tap_l2') WHERE key = 'tap-N'$$,
                  $$VALUES (6, 2)$$, '... and the one after its backoff gets it (attempt 2)');
SAVEPOINT work2;
INSERT INTO tap_done VALUES (6);
SELECT is(relay_ack(ARRAY[pg_temp.id_of(6)]), 1, 'the second attempt does the work and acks');
RELEASE SAVEPOINT work2;
SELECT results_eq('SELECT n FROM tap_done', ARRAY[6], 'the work is done once');
SELECT throws_ok(format('SELECT relay_ack(ARRAY[%s, %s])', pg_temp.id_of(7), :n1),
                 'P0002', format('delivery %s does not exist', :n1),
                 'another ack of N1 (a duplicate consumer whose lease ran out) fails ...');
SELECT is((SELECT count(*) FROM relay.deliveries WHERE payload = '{"tap_l": 7}'), 1::bigint,
          '... and acks nothing else: N2 is still pending');

SELECT * FROM finish();
ROLLBACK;
