-- Admin functions, run as a member of relay_admin: pause/resume (publishing goes
-- on, relay_claim hands nothing over, relay.handler_stats shows it), cancel
-- (recorded as a dead letter with reason 'cancelled'; leased ones refused),
-- purging dead letters, pruning key counters (only keys with nothing pending or
-- dead); handler ids never reused after a restore that reset their sequence.
-- The commands docs/operations.md shows for relay_admin work as relay_admin.
BEGIN;
SELECT plan(47);

CREATE ROLE tap_adm NOLOGIN IN ROLE relay_admin;
SELECT relay_create_handler('tap_pause', 'pull');
SELECT relay_route('tap.pause.#', 'tap_pause');
SELECT relay_create_handler('tap_cancel', 'pull', NULL, '{"max_attempts": 1}');
SELECT relay_route('tap.cancel.#', 'tap_cancel');
SELECT relay_publish('tap.pause.x', jsonb_build_object('n', i), 'tap-pause-' || i) FROM generate_series(1, 3) i;

-- ---------------------------------------------------------------- pause / resume
SET ROLE tap_adm;
SELECT lives_ok($$SELECT relay_pause_handler('tap_pause')$$, 'relay_admin: relay_pause_handler');
SELECT lives_ok($$SELECT relay_pause_handler('tap_pause')$$, 'pausing a paused handler is a no-op');
SELECT is((SELECT paused FROM relay.handler_stats WHERE handler = 'tap_pause'), true,
          'relay.handler_stats shows the handler paused');
SELECT throws_ok($$SELECT relay_pause_handler('tap_nope')$$, '42704', 'handler "tap_nope" does not exist',
                 'pausing an unknown handler: 42704');
SELECT throws_ok($$SELECT relay_pause_handler(NULL)$$, '22004', 'name must not be NULL', 'pausing NULL: 22004');
SELECT throws_ok($$SELECT relay_resume_handler('tap_nope')$$, '42704', 'handler "tap_nope" does not exist',
                 'resuming an unknown handler: 42704');
RESET ROLE;
SELECT is((SELECT count(*) FROM relay_claim('tap_pause', 10)), 0::bigint, 'a paused handler hands nothing over');
SELECT lives_ok($$SELECT relay_publish('tap.pause.x', '{"n": 4}', 'tap-pause-4')$$, 'publishing continues');
SELECT results_eq($$SELECT pending, ready, in_flight FROM relay.handler_stats WHERE handler = 'tap_pause'$$,
                  $$VALUES (4::bigint, 4::bigint, 0::bigint)$$, 'the paused handler''s deliveries wait');
SET ROLE tap_adm;
SELECT lives_ok($$SELECT relay_resume_handler('tap_pause')$$, 'relay_admin: relay_resume_handler');
RESET ROLE;
SELECT is((SELECT paused FROM relay.handler_stats WHERE handler = 'tap_pause'), false, 'resumed');
SELECT results_eq($$SELECT (payload->>'n')::int FROM relay_claim('tap_pause', 10) ORDER BY 1$$,
                  ARRAY[1, 2, 3, 4], 'the resumed handler hands over everything');

-- ---------------------------------------------------------------- cancel
SELECT relay_publish('tap.cancel.x', jsonb_build_object('n', i), 'tap-cancel-' || i) FROM generate_series(1, 3) i;
SELECT id AS c1 FROM relay.deliveries WHERE topic = 'tap.cancel.x' AND payload = '{"n": 1}' \gset
SELECT id AS c2 FROM relay.deliveries WHERE topic = 'tap.cancel.x' AND payload = '{"n": 2}' \gset
SELECT id AS c3 FROM relay.deliveries WHERE topic = 'tap.cancel.x' AND payload = '{"n": 3}' \gset
SELECT is((SELECT id FROM relay_claim('tap_cancel', 1)), :c1::bigint, 'the first is leased');
SET ROLE tap_adm;
SELECT throws_ok(format('SELECT relay_cancel(ARRAY[%s, %s])', :c1, :c2), '55P03',
                 format('deliveries {%s} are leased', :c1), 'cancelling a leased delivery: 55P03');
SELECT is((SELECT count(*) FROM relay.deliveries WHERE topic = 'tap.cancel.x'), 3::bigint,
          'and nothing was cancelled');
SELECT is(relay_cancel(ARRAY[:c2, :c3, -1]), 2, 'relay_admin: relay_cancel cancels the pending ones, skips unknown ids');
SELECT results_eq(format('SELECT id, reason, handler, last_error, attempts FROM relay.dead_letters WHERE id IN (%s, %s) ORDER BY id', :c2, :c3),
                  format($$VALUES (%s::bigint, 'cancelled', 'tap_cancel', 'cancelled by %s', 0),
                                  (%s::bigint, 'cancelled', 'tap_cancel', 'cancelled by %s', 0)$$,
                         :c2, session_user, :c3, session_user),
                  'each is recorded in relay.dead_letters with reason cancelled');
SELECT is((SELECT count(*) FROM relay.deliveries WHERE id IN (:c2, :c3)), 0::bigint, 'and is no longer pending');
SELECT is(relay_cancel(ARRAY[:c2]), 0, 'cancelling again changes nothing');
SELECT throws_ok($$SELECT relay_cancel(NULL)$$, '22004', 'ids must not be NULL', 'relay_cancel(NULL): 22004');
RESET ROLE;
SELECT is(relay_nack(:c1, 'fails'), 'dead', 'the leased one ends as its holder says');
SELECT is((SELECT reason FROM relay.dead_letters WHERE id = :c1), 'failed', 'a failed delivery''s reason: failed');

-- ---------------------------------------------------------------- purge dead letters
SET ROLE tap_adm;
SELECT is(relay_purge_dead_letters('tap_cancel', interval '1 hour'), 0::bigint, 'nothing is older than an hour');
SELECT throws_ok($$SELECT relay_purge_dead_letters('tap_nope')$$, '42704',
                 'handler "tap_nope" does not exist and has no dead letters', 'purging an unknown handler: 42704');
SELECT throws_ok($$SELECT relay_purge_dead_letters(older_than => interval '-1 day')$$, '22023',
                 'older_than must not be negative', 'a negative older_than: 22023');
SELECT is(relay_replay(ids => ARRAY[:c3]), 1, 'a cancelled delivery can be replayed');
SELECT is(relay_purge_dead_letters('tap_cancel'), 2::bigint, 'relay_admin: relay_purge_dead_letters(handler)');
SELECT is((SELECT count(*) FROM relay.dead_letters WHERE handler = 'tap_cancel'), 0::bigint, 'they are gone');
RESET ROLE;

-- ---------------------------------------------------------------- prune key counters
-- kept: a key with a pending delivery, a key with a dead letter; pruned: a key
-- whose deliveries are all done.
SELECT relay_publish('tap.cancel.x', '{"p": "done"}', 'tap-prune-done');
SELECT relay_ack(array_agg(id)) FROM relay_claim('tap_cancel', 10) WHERE key = 'tap-prune-done';
SELECT relay_publish('tap.pause.x', '{"p": "pending"}', 'tap-prune-pending');
SELECT relay_publish('tap.cancel.x', '{"p": "dead"}', 'tap-prune-dead');
SELECT relay_nack(id, 'fails') FROM relay_claim('tap_cancel', 10) WHERE key = 'tap-prune-dead';
SET ROLE tap_adm;
SELECT cmp_ok(relay_prune_key_seqs(), '>=', 1::bigint, 'relay_admin: relay_prune_key_seqs');
RESET ROLE;
SELECT results_eq($$SELECT key, seq FROM relay.key_seqs WHERE key LIKE 'tap-prune-%' ORDER BY key$$,
                  $$VALUES ('tap-prune-dead', 1::bigint), ('tap-prune-pending', 1::bigint)$$,
                  'only the counter of the key with nothing pending or dead is gone');
SELECT is((SELECT count(*) FROM relay.key_seqs k WHERE NOT EXISTS (SELECT 1 FROM relay.deliveries d WHERE d.key = k.key)
                                                  AND NOT EXISTS (SELECT 1 FROM relay.dead_letters x WHERE x.key = k.key)),
          0::bigint, 'no counter of an idle key is left');
SELECT relay_publish('tap.pause.x', '{"p": "pending2"}', 'tap-prune-pending');
SELECT is((SELECT seq FROM relay.deliveries WHERE payload = '{"p": "pending2"}'), 2::bigint,
          'a kept key continues its seq');

-- ---------------------------------------------------------------- handler ids
SELECT relay_create_handler('tap_gone', 'pull', NULL, '{"max_attempts": 1}') AS gone_id \gset
SELECT relay_route('tap.gone.#', 'tap_gone');
SELECT relay_publish('tap.gone.x', '{"gone": true}');
SELECT relay_nack(id, 'fails') FROM relay_claim('tap_gone', 10);
SELECT relay_drop_handler('tap_gone');
-- A restore of a dump without the sequence (0.1.0's) starts it again at 1.
SELECT setval(pg_get_serial_sequence('relay.handlers', 'id'), 1, false);
SET ROLE tap_adm;
SELECT cmp_ok(relay_create_handler('tap_fresh', 'pull'), '>', :gone_id, 'a new handler never gets a used id');
SELECT relay_route('tap.gone.#', 'tap_fresh');
SELECT is(relay_replay('tap_fresh'), 0, 'the dropped handler''s dead letters do not reach it');
SELECT is((SELECT count(*) FROM relay.dead_letters WHERE handler = 'tap_gone'), 1::bigint,
          'they stay in relay.dead_letters');
SELECT is(relay_purge_dead_letters('tap_gone'), 1::bigint, 'and can be purged by the dropped handler''s name');

-- ---------------------------------------------------------------- docs/operations.md as relay_admin
SELECT lives_ok($$SELECT * FROM relay.handler_stats$$, 'operations.md: SELECT * FROM relay.handler_stats');
SELECT lives_ok($$SELECT * FROM relay.workers$$, 'operations.md: SELECT * FROM relay.workers');
SELECT lives_ok($$SELECT * FROM relay._leases()$$, 'operations.md: relay._leases()');
SELECT lives_ok($$SELECT id, handler, topic, key, seq, attempts, reason, last_error, failed_at FROM relay.dead_letters$$,
                'operations.md: reading relay.dead_letters');
SELECT lives_ok($$SELECT relay_replay('tap_pause')$$, 'operations.md: relay_replay(handler)');
SELECT lives_ok($$SELECT relay_replay(ids => ARRAY[123, 456])$$, 'operations.md: relay_replay(ids)');
SELECT lives_ok($$SELECT relay_purge_dead_letters(older_than => interval '30 days')$$,
                'operations.md: relay_purge_dead_letters(older_than)');
SELECT lives_ok($$SELECT relay_prune_key_seqs()$$, 'operations.md: relay_prune_key_seqs()');
SELECT lives_ok($$SELECT relay_pause_handler('tap_pause'); SELECT relay_resume_handler('tap_pause')$$,
                'operations.md: pause and resume');
SELECT lives_ok(format('SELECT relay_cancel(ARRAY[%s])', :c2), 'operations.md: relay_cancel');
SELECT throws_ok($$DELETE FROM relay.dead_letters$$, '42501', NULL, 'writing relay.dead_letters directly stays refused');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
