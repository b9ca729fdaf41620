-- relay_monitor reads every stats view and nothing else: no table (payloads,
-- secrets), no claim, ack, nack, extend, payload fetch, publish or admin call.
-- The views carry the database.
BEGIN;
SELECT plan(27);

CREATE ROLE tap_monitor NOLOGIN IN ROLE relay_monitor;
SELECT relay_create_handler('tap_mon', 'pull');
SELECT relay_create_handler('tap_mon_hook', 'http', 'https://example.com/hook',
                            '{"secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}');
SELECT relay_route('tap.mon.#', 'tap_mon');
SELECT relay_publish('tap.mon.x', '{"card": "secret"}', 'tap-mon-1');
SELECT id AS d1 FROM relay.deliveries WHERE payload = '{"card": "secret"}' \gset

SET ROLE tap_monitor;
SELECT is((SELECT count(*) FROM relay.handler_stats WHERE handler LIKE 'tap_mon%'), 2::bigint,
          'monitor: reads relay.handler_stats');
SELECT is((SELECT pending FROM relay.handler_stats WHERE handler = 'tap_mon'), 1::bigint,
          'monitor: relay.handler_stats counts the pending delivery');
SELECT is((SELECT database::text FROM relay.handler_stats WHERE handler = 'tap_mon'), current_database()::text,
          'monitor: relay.handler_stats has the database');
SELECT is((SELECT count(*) FROM relay.handler_metrics WHERE handler LIKE 'tap_mon%'), 2::bigint,
          'monitor: reads relay.handler_metrics');
SELECT is((SELECT database::text FROM relay.handler_metrics WHERE handler = 'tap_mon'), current_database()::text,
          'monitor: relay.handler_metrics has the database');
SELECT ok((SELECT oldest_pending_seconds >= 0 FROM relay.handler_metrics WHERE handler = 'tap_mon'),
          'monitor: relay.handler_metrics has the age of the oldest pending delivery');
SELECT lives_ok($$SELECT * FROM relay.handler_latency_buckets$$, 'monitor: reads relay.handler_latency_buckets');
SELECT lives_ok($$SELECT * FROM relay.workers$$, 'monitor: reads relay.workers');
SELECT throws_ok($$SELECT count(*) FROM relay.deliveries$$, '42501', NULL, 'monitor: cannot read relay.deliveries (payloads)');
SELECT throws_ok($$SELECT count(*) FROM relay.events$$, '42501', NULL, 'monitor: cannot read relay.events');
SELECT throws_ok($$SELECT count(*) FROM relay.dead_letters$$, '42501', NULL, 'monitor: cannot read relay.dead_letters');
SELECT throws_ok($$SELECT secrets FROM relay.handlers$$, '42501', NULL, 'monitor: cannot read relay.handlers (secrets)');
SELECT throws_ok($$SELECT count(*) FROM relay.routes$$, '42501', NULL, 'monitor: cannot read relay.routes');
SELECT throws_ok($$SELECT count(*) FROM relay.key_seqs$$, '42501', NULL, 'monitor: cannot read relay.key_seqs');
SELECT throws_ok(format('SELECT relay_payload(%s)', :d1), '42501', NULL, 'monitor: cannot call relay_payload');
SELECT throws_ok($$SELECT * FROM relay_claim('tap_mon')$$, '42501', NULL, 'monitor: cannot call relay_claim');
SELECT throws_ok(format('SELECT relay_ack(ARRAY[%s]::bigint[])', :d1), '42501', NULL, 'monitor: cannot call relay_ack');
SELECT throws_ok(format('SELECT relay_nack(%s)', :d1), '42501', NULL, 'monitor: cannot call relay_nack');
SELECT throws_ok(format('SELECT relay_extend(%s, gen_random_uuid())', :d1), '42501', NULL,
                 'monitor: cannot call relay_extend');
SELECT throws_ok($$SELECT relay_publish('tap.mon.x', '{}')$$, '42501', NULL, 'monitor: cannot call relay_publish');
SELECT throws_ok($$SELECT relay_create_handler('tap_mon_new', 'pull')$$, '42501', NULL,
                 'monitor: cannot call relay_create_handler');
SELECT throws_ok($$SELECT relay_replay('tap_mon')$$, '42501', NULL, 'monitor: cannot call relay_replay');
RESET ROLE;

SELECT ok(pg_has_role('relay_admin', 'relay_monitor', 'MEMBER'), 'relay_admin is a member of relay_monitor');
SELECT ok(NOT has_function_privilege('public', 'relay._handler_totals()', 'EXECUTE'),
          'PUBLIC cannot call relay._handler_totals()');
SELECT ok(NOT has_table_privilege('public', 'relay.handler_metrics', 'SELECT'),
          'PUBLIC cannot read relay.handler_metrics');
SELECT ok(has_table_privilege('relay_consumer', 'relay.handler_metrics', 'SELECT'),
          'relay_consumer reads relay.handler_metrics too');
SELECT is((SELECT count(*) FROM pg_catalog.pg_auth_members m JOIN pg_catalog.pg_roles r ON r.oid = m.roleid
            WHERE m.member = 'relay_monitor'::regrole), 0::bigint,
          'relay_monitor is a member of no other role');

SELECT * FROM finish();
ROLLBACK;
