-- Roles: relay_publisher publishes only; relay_consumer claims, acks, nacks
-- and reads relay.handler_stats; relay_admin does everything and reads every
-- table (secrets included); a role with none of them (PUBLIC) can do nothing.
BEGIN;
SELECT plan(68);
SET LOCAL relaybus.priority_aging = 0;

CREATE ROLE tap_publisher NOLOGIN IN ROLE relay_publisher;
CREATE ROLE tap_consumer NOLOGIN IN ROLE relay_consumer;
CREATE ROLE tap_admin NOLOGIN IN ROLE relay_admin;
CREATE ROLE tap_nobody NOLOGIN;

SELECT relay_create_handler('tap_roles', 'pull', NULL, '{"max_attempts": 5}');
SELECT relay_create_handler('tap_hook', 'http', 'https://example.com/hook',
                            '{"secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}');
SELECT relay_route('tap.roles.#', 'tap_roles');
SELECT relay_publish('tap.roles.x', jsonb_build_object('n', i), 'tap-role-' || i) FROM generate_series(1, 6) i;

-- The calls under test. Ids are picked by superuser beforehand.
SELECT id AS d1 FROM relay.deliveries WHERE payload = '{"n": 1}' \gset
SELECT id AS d2 FROM relay.deliveries WHERE payload = '{"n": 2}' \gset
SELECT id AS d3 FROM relay.deliveries WHERE payload = '{"n": 3}' \gset
SELECT id AS d4 FROM relay.deliveries WHERE payload = '{"n": 4}' \gset

-- ---------------------------------------------------------------- relay_publisher
SET ROLE tap_publisher;
SELECT lives_ok($$SELECT relay_publish('tap.roles.p', '{"by": "publisher"}', 'tap-role-p')$$,
                'publisher: relay_publish');
SELECT lives_ok($$SELECT relay_publish_batch('tap.roles.p', ARRAY['{"by": "publisher"}']::jsonb[])$$,
                'publisher: relay_publish_batch');
SELECT throws_ok($$SELECT count(*) FROM relay.deliveries$$, '42501', NULL, 'publisher: cannot read relay.deliveries');
SELECT throws_ok($$SELECT secrets FROM relay.handlers$$, '42501', NULL, 'publisher: cannot read relay.handlers (secrets)');
SELECT throws_ok($$SELECT * FROM relay.dead_letters$$, '42501', NULL, 'publisher: cannot read relay.dead_letters');
SELECT throws_ok($$SELECT * FROM relay.handler_stats$$, '42501', NULL, 'publisher: cannot read relay.handler_stats');
SELECT throws_ok($$SELECT relay_create_handler('tap_p_new', 'pull')$$, '42501', NULL,
                 'publisher: cannot call relay_create_handler');
SELECT throws_ok($$SELECT relay_route('tap.x', 'tap_roles')$$, '42501', NULL, 'publisher: cannot call relay_route');
SELECT throws_ok($$SELECT * FROM relay_claim('tap_roles')$$, '42501', NULL, 'publisher: cannot call relay_claim');
SELECT throws_ok(format('SELECT relay_ack(ARRAY[%s])', :d1), '42501', NULL, 'publisher: cannot call relay_ack');
SELECT throws_ok(format('SELECT relay_nack(%s)', :d1), '42501', NULL, 'publisher: cannot call relay_nack');
SELECT throws_ok($$SELECT relay_replay()$$, '42501', NULL, 'publisher: cannot call relay_replay');
RESET ROLE;
SELECT is((SELECT count(*) FROM relay.deliveries WHERE payload = '{"by": "publisher"}'), 2::bigint,
          'the publisher''s two events were delivered');
SELECT is((SELECT count(*) FROM relay._leases() WHERE delivery_id IN (:d1)), 0::bigint,
          'and it claimed nothing');

-- ---------------------------------------------------------------- relay_consumer
SET ROLE tap_consumer;
SELECT results_eq($$SELECT (payload->>'n')::int FROM relay_claim('tap_roles', 4) ORDER BY 1$$,
                  ARRAY[1, 2, 3, 4], 'consumer: relay_claim');
SELECT is(relay_ack(ARRAY[:d1, :d2]), 2, 'consumer: relay_ack');
SELECT is(relay_nack(:d3, 'consumer failed'), 'retry', 'consumer: relay_nack');
SELECT results_eq($$SELECT handler, pending, retrying FROM relay.handler_stats WHERE handler = 'tap_roles'$$,
                  $$VALUES ('tap_roles', 6::bigint, 1::bigint)$$, 'consumer: reads relay.handler_stats');
SELECT throws_ok($$SELECT relay_publish('tap.roles.c', '{}')$$, '42501', NULL, 'consumer: cannot call relay_publish');
SELECT throws_ok($$SELECT relay_publish_batch('tap.roles.c', ARRAY['{}']::jsonb[])$$, '42501', NULL,
                 'consumer: cannot call relay_publish_batch');
SELECT throws_ok($$SELECT count(*) FROM relay.deliveries$$, '42501', NULL, 'consumer: cannot read relay.deliveries');
SELECT throws_ok($$SELECT secrets FROM relay.handlers$$, '42501', NULL, 'consumer: cannot read relay.handlers (secrets)');
SELECT throws_ok($$SELECT * FROM relay.routes$$, '42501', NULL, 'consumer: cannot read relay.routes');
SELECT throws_ok($$SELECT * FROM relay.dead_letters$$, '42501', NULL, 'consumer: cannot read relay.dead_letters');
SELECT throws_ok($$DELETE FROM relay.deliveries$$, '42501', NULL, 'consumer: cannot delete deliveries directly');
SELECT throws_ok($$SELECT relay_create_handler('tap_c_new', 'pull')$$, '42501', NULL,
                 'consumer: cannot call relay_create_handler');
SELECT throws_ok($$SELECT relay_alter_handler('tap_roles', options => '{"lease": "1s"}')$$, '42501', NULL,
                 'consumer: cannot call relay_alter_handler');
SELECT throws_ok($$SELECT relay_drop_handler('tap_roles', true)$$, '42501', NULL,
                 'consumer: cannot call relay_drop_handler');
SELECT throws_ok($$SELECT relay_unroute('tap.roles.#', 'tap_roles')$$, '42501', NULL,
                 'consumer: cannot call relay_unroute');
SELECT throws_ok($$SELECT relay_replay('tap_roles')$$, '42501', NULL, 'consumer: cannot call relay_replay');
RESET ROLE;
SELECT results_eq($$SELECT (payload->>'n')::int, attempt, last_error FROM relay.deliveries
                     WHERE payload->>'n' IN ('1', '2', '3') ORDER BY 1$$,
                  $$VALUES (3, 1, 'consumer failed')$$, 'the consumer''s acks and nack took effect');

-- ---------------------------------------------------------------- relay_admin
SET ROLE tap_admin;
SELECT lives_ok($$SELECT relay_create_handler('tap_admin_h', 'pull', NULL, '{"max_attempts": 1}')$$,
                'admin: relay_create_handler');
SELECT lives_ok($$SELECT relay_alter_handler('tap_admin_h', options => '{"lease": "5s"}')$$,
                'admin: relay_alter_handler');
SELECT lives_ok($$SELECT relay_route('tap.admin', 'tap_admin_h', 'admin.wire')$$, 'admin: relay_route');
SELECT lives_ok($$SELECT relay_publish('tap.admin', '{"n": 100}', 'tap-role-a')$$, 'admin: relay_publish');
SELECT lives_ok($$SELECT relay_publish_batch('tap.admin', ARRAY['{"n": 101}']::jsonb[])$$,
                'admin: relay_publish_batch');
SELECT results_eq($$SELECT topic FROM relay_claim('tap_admin_h', 1)$$, ARRAY['admin.wire'], 'admin: relay_claim');
SELECT is(relay_nack((SELECT id FROM relay.deliveries WHERE payload = '{"n": 100}'), 'admin failed'), 'dead',
          'admin: relay_nack (dead letter)');
SELECT is(relay_replay('tap_admin_h'), 1, 'admin: relay_replay');
SELECT is(relay_ack(array(SELECT id FROM relay_claim('tap_admin_h', 10))), 2, 'admin: relay_ack');
SELECT is(relay_unroute('tap.admin', 'tap_admin_h'), true, 'admin: relay_unroute');
SELECT lives_ok($$SELECT relay_drop_handler('tap_admin_h')$$, 'admin: relay_drop_handler');
SELECT is((SELECT secrets FROM relay.handlers WHERE name = 'tap_hook'),
          ARRAY['whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw'], 'admin: reads the secrets');
SELECT is((SELECT count(*) FROM relay.deliveries WHERE key LIKE 'tap-role-%'), 5::bigint,
          'admin: reads relay.deliveries');
SELECT lives_ok($$SELECT * FROM relay.routes$$, 'admin: reads relay.routes');
SELECT lives_ok($$SELECT * FROM relay.dead_letters$$, 'admin: reads relay.dead_letters');
SELECT lives_ok($$SELECT * FROM relay.key_seqs$$, 'admin: reads relay.key_seqs');
SELECT lives_ok($$SELECT * FROM relay.handler_stats$$, 'admin: reads relay.handler_stats');
SELECT lives_ok($$SELECT * FROM relay._leases()$$, 'admin: reads relay._leases()');
SELECT is(relay.lane_of('a'), 12, 'admin: relay.lane_of');
SELECT throws_ok($$DELETE FROM relay.deliveries$$, '42501', NULL, 'admin: cannot write relay.deliveries directly');
SELECT throws_ok($$UPDATE relay.handlers SET target = NULL$$, '42501', NULL, 'admin: cannot write relay.handlers directly');
SELECT throws_ok($$INSERT INTO relay.key_seqs VALUES ('x', 1)$$, '42501', NULL, 'admin: cannot write relay.key_seqs directly');
RESET ROLE;

-- ---------------------------------------------------------------- no role (PUBLIC)
SELECT count(*) AS before_nobody FROM relay.deliveries \gset
SET ROLE tap_nobody;
SELECT throws_ok($$SELECT relay_publish('tap.roles.n', '{}')$$, '42501', NULL, 'nobody: relay_publish');
SELECT throws_ok($$SELECT relay_publish_batch('tap.roles.n', ARRAY['{}']::jsonb[])$$, '42501', NULL,
                 'nobody: relay_publish_batch');
SELECT throws_ok($$SELECT * FROM relay_claim('tap_roles')$$, '42501', NULL, 'nobody: relay_claim');
SELECT throws_ok(format('SELECT relay_ack(ARRAY[%s])', :d4), '42501', NULL, 'nobody: relay_ack');
SELECT throws_ok(format('SELECT relay_nack(%s)', :d4), '42501', NULL, 'nobody: relay_nack');
SELECT throws_ok($$SELECT relay_create_handler('tap_n_new', 'pull')$$, '42501', NULL, 'nobody: relay_create_handler');
SELECT throws_ok($$SELECT relay_alter_handler('tap_roles')$$, '42501', NULL, 'nobody: relay_alter_handler');
SELECT throws_ok($$SELECT relay_drop_handler('tap_roles', true)$$, '42501', NULL, 'nobody: relay_drop_handler');
SELECT throws_ok($$SELECT relay_route('tap.n', 'tap_roles')$$, '42501', NULL, 'nobody: relay_route');
SELECT throws_ok($$SELECT relay_unroute('tap.roles.#', 'tap_roles')$$, '42501', NULL, 'nobody: relay_unroute');
SELECT throws_ok($$SELECT relay_replay()$$, '42501', NULL, 'nobody: relay_replay');
SELECT throws_ok($$SELECT * FROM relay.handler_stats$$, '42501', NULL, 'nobody: relay.handler_stats');
SELECT throws_ok($$SELECT * FROM relay.handlers$$, '42501', NULL, 'nobody: relay.handlers');
SELECT throws_ok($$SELECT relay.lane_of('a')$$, '42501', NULL, 'nobody: relay.lane_of');
RESET ROLE;
SELECT is((SELECT count(*) FROM relay.deliveries), :before_nobody::bigint, 'nobody changed nothing');

SELECT * FROM finish();
ROLLBACK;
