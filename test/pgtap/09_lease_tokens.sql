-- Leases are receipts: relay_claim returns each lease's token (column lease),
-- and relay_ack / relay_nack / relay_extend are compare-and-release on
-- (delivery, token). A stale, forged or foreign completion changes nothing and
-- fails with 55P03; a delivery that no longer exists keeps P0002. The id-only
-- forms are accepted for leases this session took (other sessions:
-- test/isolation/specs/lease_*.spec). A lease that runs out counts a failed
-- attempt and ends in dead letters after max_attempts.
BEGIN;
SELECT plan(45);
SET LOCAL relaybus.priority_aging = 0;

CREATE FUNCTION pg_temp.id_of(n int) RETURNS bigint LANGUAGE sql AS $$
    SELECT id FROM relay.deliveries WHERE payload = jsonb_build_object('tap_t', n)
$$;
CREATE TEMP TABLE mine (n int, id bigint, lease uuid, lease_until timestamptz);
CREATE FUNCTION pg_temp.take(handler text, lease interval DEFAULT '30s') RETURNS SETOF int LANGUAGE sql AS $$
    INSERT INTO mine SELECT (c.payload->>'tap_t')::int, c.id, c.lease, c.lease_until
      FROM relay_claim(handler, 100, lease, 10) c RETURNING n
$$;
CREATE FUNCTION pg_temp.lease_of(n int) RETURNS uuid LANGUAGE sql AS $$
    SELECT lease FROM mine WHERE mine.n = lease_of.n ORDER BY lease_until DESC LIMIT 1
$$;

SELECT relay_create_handler('tap_t1', 'pull');
SELECT relay_create_handler('tap_t2', 'pull', NULL,
                            '{"lease": "1s", "max_attempts": 2, "backoff_base": "1ms", "backoff_max": "1ms"}');
SELECT relay_create_handler('tap_t_fire', 'notify', 'tap_t_fire', '{"ack": false}');
SELECT relay_route('tap.t1', 'tap_t1');
SELECT relay_route('tap.t2', 'tap_t2');
SELECT relay_publish('tap.t1', jsonb_build_object('tap_t', g), 'tap-T' || g) FROM generate_series(1, 5) g;

-- ---------------------------------------------------------------- the lease column
SELECT results_eq($$SELECT * FROM pg_temp.take('tap_t1') ORDER BY 1$$, ARRAY[1, 2, 3, 4, 5], 'claim five');
SELECT col_type_is('mine', 'lease', 'uuid', 'relay_claim returns a uuid column lease');
SELECT is((SELECT count(DISTINCT lease) FROM mine WHERE lease IS NOT NULL), 5::bigint,
          'every hand-over has its own lease token');
SELECT is((SELECT proargnames[array_position(proargnames, 'lease_until') + 1] FROM pg_proc WHERE proname = 'relay_claim'),
          'lease', 'lease is relay_claim''s column after lease_until (traceparent, 0.3.0''s, follows it)');

-- ---------------------------------------------------------------- ack / nack / extend with the token
SELECT throws_ok(format('SELECT relay_ack(ARRAY[%s], ARRAY[gen_random_uuid()])', pg_temp.id_of(1)),
                 '55P03', format('lease of delivery %s is not held: another holder', pg_temp.id_of(1)),
                 'ack with a wrong token: 55P03');
SELECT throws_ok(format('SELECT relay_ack(ARRAY[%s], ARRAY[%L::uuid])', pg_temp.id_of(1), pg_temp.lease_of(2)),
                 '55P03', NULL, 'ack with the token of another delivery: 55P03');
SELECT throws_ok(format('SELECT relay_ack(ARRAY[%s, %s], ARRAY[%L::uuid, gen_random_uuid()])',
                        pg_temp.id_of(1), pg_temp.id_of(2), pg_temp.lease_of(1)),
                 '55P03', NULL, 'a batch with one bad token fails ...');
SELECT is((SELECT count(*) FROM relay.deliveries WHERE payload IN ('{"tap_t": 1}', '{"tap_t": 2}')), 2::bigint,
          '... and acks nothing');
SELECT throws_ok(format('SELECT relay_ack(ARRAY[%s], ARRAY[]::uuid[])', pg_temp.id_of(1)),
                 '22023', 'leases must have as many elements as ids (1), not 0', 'leases and ids must pair up');
SELECT is(relay_ack(ARRAY[pg_temp.id_of(1)], ARRAY[pg_temp.lease_of(1)]), 1, 'ack with its token: acked');
SELECT throws_ok(format('SELECT relay_ack(ARRAY[%s], ARRAY[%L::uuid])', pg_temp.id_of(2) + 1000000, pg_temp.lease_of(2)),
                 'P0002', NULL, 'ack of a delivery that does not exist: P0002');
SELECT throws_ok(format('SELECT relay_nack(%s, ''x'', ''0s'', gen_random_uuid())', pg_temp.id_of(2)),
                 '55P03', format('lease of delivery %s is not held: another holder', pg_temp.id_of(2)),
                 'nack with a wrong token: 55P03');
SELECT is((SELECT attempt FROM relay.deliveries WHERE id = pg_temp.id_of(2)), 0, '... and no attempt counted');
SELECT is(relay_nack(pg_temp.id_of(2), 'x', '1 hour', pg_temp.lease_of(2)), 'retry', 'nack with its token: retry');
SELECT is(relay_nack(pg_temp.id_of(3), 'x', '1 hour'), 'retry', 'id-only nack of a lease this session took');
SELECT is(relay_ack(ARRAY[pg_temp.id_of(4)]), 1, 'id-only ack of a lease this session took');
SELECT throws_ok(format('SELECT relay_nack(%s, ''x'', NULL, %L::uuid)', (SELECT id FROM mine WHERE n = 1),
                        pg_temp.lease_of(1)),
                 'P0002', NULL, 'nack of an acked delivery: P0002');

-- relay_extend
SELECT ok((SELECT relay_extend(pg_temp.id_of(5), pg_temp.lease_of(5), '2 hours')
             BETWEEN clock_timestamp() + interval '119 minutes' AND clock_timestamp() + interval '2 hours'),
          'relay_extend returns the new end of the lease, counted from now');
SELECT ok((SELECT lease_until > clock_timestamp() + interval '119 minutes' FROM relay._leases()
            WHERE delivery_id = pg_temp.id_of(5)), 'and the lease is that long');
SELECT ok((SELECT relay_extend(pg_temp.id_of(5), NULL) <= clock_timestamp() + interval '30s'),
          'id-only, default extend_by: the handler''s lease (30s)');
SELECT throws_ok(format('SELECT relay_extend(%s, gen_random_uuid(), ''1 hour'')', pg_temp.id_of(5)),
                 '55P03', NULL, 'extend with a wrong token: 55P03');
SELECT throws_ok(format('SELECT relay_extend(%s, %L::uuid, ''0.5s'')', pg_temp.id_of(5), pg_temp.lease_of(5)),
                 '22023', 'extend_by must be between 1 second and 1 day', 'extend_by out of range: 22023');
SELECT throws_ok(format('SELECT relay_extend(%s, %L::uuid)', (SELECT id FROM mine WHERE n = 1), pg_temp.lease_of(1)),
                 'P0002', NULL, 'extend of a delivery that no longer exists: P0002');
SELECT throws_ok($$SELECT relay_extend(NULL, NULL)$$, '22004', 'id must not be NULL', 'extend of NULL: 22004');

-- ---------------------------------------------------------------- fire-and-forget notify: no claims
SELECT throws_ok($$SELECT * FROM relay_claim('tap_t_fire')$$, '42809',
                 'handler "tap_t_fire" is not a pull handler or an ack-mode notify handler',
                 'relay_claim refuses a fire-and-forget notify handler: 42809');

-- ---------------------------------------------------------------- the 0.1.0 signatures
-- A server may run this library before ALTER EXTENSION relaybus UPDATE: the C
-- functions still serve the 0.1.0 SQL signatures (no lease column, id-only).
CREATE FUNCTION pg_temp.claim_010(handler text, max integer DEFAULT 100, lease interval DEFAULT NULL,
                                  per_key integer DEFAULT 1)
RETURNS TABLE (id bigint, event_id bigint, topic text, key text, seq bigint, payload jsonb,
               headers jsonb, attempt integer, priority integer, published_at timestamptz,
               lease_until timestamptz)
AS '$libdir/relaybus', 'relay_claim' LANGUAGE C VOLATILE;
CREATE FUNCTION pg_temp.ack_010(ids bigint[]) RETURNS integer AS '$libdir/relaybus', 'relay_ack' LANGUAGE C;
CREATE FUNCTION pg_temp.nack_010(id bigint, error text DEFAULT NULL, retry_in interval DEFAULT NULL)
RETURNS text AS '$libdir/relaybus', 'relay_nack' LANGUAGE C;
SELECT relay_publish('tap.t1', jsonb_build_object('tap_t', g), 'tap-O' || g) FROM generate_series(20, 21) g;
SELECT results_eq($$SELECT (payload->>'tap_t')::int FROM pg_temp.claim_010('tap_t1') ORDER BY 1$$, ARRAY[20, 21],
                  '0.1.0''s relay_claim (11 columns) still claims');
SELECT is(pg_temp.ack_010(ARRAY[pg_temp.id_of(20)]), 1, '0.1.0''s relay_ack(ids): the id-only form');
SELECT is(pg_temp.nack_010(pg_temp.id_of(21), 'x', '1 hour'), 'retry', '0.1.0''s relay_nack(id, error, retry_in)');
CREATE FUNCTION pg_temp.publish_010(topic text, payload jsonb, key text DEFAULT NULL, headers jsonb DEFAULT NULL,
                                    priority integer DEFAULT 1, not_before timestamptz DEFAULT NULL)
RETURNS bigint AS '$libdir/relaybus', 'relay_publish' LANGUAGE C;
CREATE FUNCTION pg_temp.batch_010(topic text, payloads jsonb[], keys text[] DEFAULT NULL, headers jsonb DEFAULT NULL,
                                  priority integer DEFAULT 1, not_before timestamptz DEFAULT NULL)
RETURNS bigint[] AS '$libdir/relaybus', 'relay_publish_batch' LANGUAGE C;
SELECT ok(pg_temp.publish_010('tap.t1', jsonb_build_object('tap_t', 22), 'tap-O22') IS NOT NULL,
          '0.1.0''s relay_publish (six arguments) publishes');
SELECT is(array_length(pg_temp.batch_010('tap.t1', ARRAY[jsonb_build_object('tap_t', 23), jsonb_build_object('tap_t', 24)],
                                         ARRAY['tap-O23', 'tap-O24']), 1), 2,
          '0.1.0''s relay_publish_batch (six arguments) publishes');
SELECT results_eq($$SELECT * FROM pg_temp.take('tap_t1') ORDER BY 1$$, ARRAY[22, 23, 24], 'the three are claimed');

-- ---------------------------------------------------------------- 0.2.0 catalogs that name the 0.1.0 symbols
-- The install script names the _v2 entry points; 0.2.0 databases installed by
-- builds before them name relay_ack, relay_nack, relay_publish and
-- relay_publish_batch with 0.2.0's signatures, and keep their lease checks
-- and dedupe keys.
SELECT is((SELECT array_agg(prosrc ORDER BY proname) FROM pg_proc
            WHERE proname IN ('relay_ack', 'relay_nack', 'relay_publish', 'relay_publish_batch')),
          ARRAY['relay_ack_v2', 'relay_nack_v2', 'relay_publish_v2', 'relay_publish_batch_v2'],
          'the installed functions name the current entry points');
CREATE FUNCTION pg_temp.ack_020(ids bigint[], leases uuid[] DEFAULT NULL) RETURNS integer
AS '$libdir/relaybus', 'relay_ack' LANGUAGE C;
CREATE FUNCTION pg_temp.nack_020(id bigint, error text DEFAULT NULL, retry_in interval DEFAULT NULL,
                                 lease uuid DEFAULT NULL)
RETURNS text AS '$libdir/relaybus', 'relay_nack' LANGUAGE C;
CREATE FUNCTION pg_temp.publish_020(topic text, payload jsonb, key text DEFAULT NULL, headers jsonb DEFAULT NULL,
                                    priority integer DEFAULT 1, not_before timestamptz DEFAULT NULL,
                                    dedupe_key text DEFAULT NULL)
RETURNS bigint AS '$libdir/relaybus', 'relay_publish' LANGUAGE C;
CREATE FUNCTION pg_temp.batch_020(topic text, payloads jsonb[], keys text[] DEFAULT NULL, headers jsonb DEFAULT NULL,
                                  priority integer DEFAULT 1, not_before timestamptz DEFAULT NULL,
                                  dedupe_keys text[] DEFAULT NULL)
RETURNS bigint[] AS '$libdir/relaybus', 'relay_publish_batch' LANGUAGE C;
SELECT throws_ok(format('SELECT pg_temp.nack_020(%s, ''x'', ''1 hour'', gen_random_uuid())', pg_temp.id_of(22)),
                 '55P03', format('lease of delivery %s is not held: another holder', pg_temp.id_of(22)),
                 'relay_nack with four arguments checks the lease');
SELECT throws_ok(format('SELECT pg_temp.ack_020(ARRAY[%s], ARRAY[gen_random_uuid()])', pg_temp.id_of(23)),
                 '55P03', format('lease of delivery %s is not held: another holder', pg_temp.id_of(23)),
                 'relay_ack with two arguments checks the leases');
SELECT is(pg_temp.ack_020(ARRAY[pg_temp.id_of(22), pg_temp.id_of(23), pg_temp.id_of(24)],
                          ARRAY[pg_temp.lease_of(22), pg_temp.lease_of(23), pg_temp.lease_of(24)]), 3,
          '... and acks with the leases');
CREATE TEMP TABLE first_dd AS SELECT pg_temp.publish_020('tap.dd', '{}', dedupe_key => 'tap-dd') AS id;
SELECT is(pg_temp.publish_020('tap.dd', '{}', dedupe_key => 'tap-dd'), (SELECT id FROM first_dd),
          'relay_publish with seven arguments keeps its dedupe_key');
SELECT is((pg_temp.batch_020('tap.dd', ARRAY['{}'::jsonb, '{}'], dedupe_keys => ARRAY['tap-dd', 'tap-dd2']))[1],
          (SELECT id FROM first_dd), 'relay_publish_batch with seven arguments keeps its dedupe_keys');

-- ---------------------------------------------------------------- an expired lease is an attempt
SELECT relay_publish('tap.t2', jsonb_build_object('tap_t', 10), 'tap-X');
SELECT results_eq($$SELECT * FROM pg_temp.take('tap_t2', NULL)$$, ARRAY[10], 'claim X1 with the handler''s 1s lease');
SELECT pg_sleep(1.1);
SELECT is_empty($$SELECT * FROM pg_temp.take('tap_t2', NULL)$$,
                'after the lease ran out, the next claim charges it and does not hand it over');
SELECT results_eq($$SELECT attempt, last_error FROM relay.deliveries WHERE id = pg_temp.id_of(10)$$,
                  $$VALUES (1, 'lease expired')$$, 'the expiry counted one failed attempt');
SELECT throws_ok(format('SELECT relay_ack(ARRAY[%s], ARRAY[%L::uuid])', pg_temp.id_of(10), pg_temp.lease_of(10)),
                 '55P03', format('lease of delivery %s is not held: it expired', pg_temp.id_of(10)),
                 'the expired lease can no longer ack');
SELECT pg_sleep(0.01);
SELECT results_eq($$SELECT (c.payload->>'tap_t')::int, c.attempt FROM relay_claim('tap_t2') c$$,
                  $$VALUES (10, 2)$$, 'after the backoff it is handed over again: attempt 2');
SELECT pg_sleep(1.1);
SELECT is_empty($$SELECT * FROM relay_claim('tap_t2')$$, 'its second lease runs out too: charged ...');
SELECT results_eq($$SELECT attempts, last_error FROM relay.dead_letters WHERE payload = '{"tap_t": 10}'$$,
                  $$VALUES (2, 'lease expired')$$, '... and with max_attempts 2 it is dead-lettered');
SELECT is_empty($$SELECT * FROM relay.deliveries WHERE payload = '{"tap_t": 10}'$$, 'no longer pending');

SELECT * FROM finish();
ROLLBACK;
