-- Publisher idempotency: a publish with a dedupe_key already used within
-- relaybus.dedupe_window returns the first event's id and creates nothing (no
-- delivery, no seq); after the window a new event is created. The batch form
-- dedupes per element, against earlier publishes and within the batch.
BEGIN;
SELECT plan(22);

CREATE ROLE tap_dd_pub NOLOGIN IN ROLE relay_publisher;
SELECT relay_create_handler('tap_dd', 'pull');
SELECT relay_route('tap.dd.#', 'tap_dd');

SELECT relay_publish('tap.dd.x', '{"n": 1}', 'tap-dd-k', dedupe_key => 'tap-dd-1') AS first \gset
SELECT is(relay_publish('tap.dd.x', '{"n": 2}', 'tap-dd-k', dedupe_key => 'tap-dd-1'), :first::bigint,
          'a second publish with the same dedupe_key returns the first event''s id');
SELECT results_eq($$SELECT payload->>'n', seq FROM relay.deliveries WHERE topic = 'tap.dd.x'$$,
                  $$VALUES ('1', 1::bigint)$$, 'and creates nothing: one delivery, seq 1');
SELECT is((SELECT seq FROM relay.key_seqs WHERE key = 'tap-dd-k'), 1::bigint, 'the key''s counter moved once');
SELECT isnt(relay_publish('tap.dd.x', '{"n": 3}', 'tap-dd-k', dedupe_key => 'tap-dd-2'), :first::bigint,
            'another dedupe_key is another event');
SELECT is((SELECT count(*) FROM relay.deliveries WHERE topic = 'tap.dd.x'), 2::bigint, 'with its delivery');
SELECT isnt(relay_publish('tap.dd.x', '{"n": 4}'), relay_publish('tap.dd.x', '{"n": 4}'),
            'without a dedupe_key every publish is an event');
SELECT is((SELECT count(*) FROM relay.deliveries WHERE topic = 'tap.dd.x'), 4::bigint, 'both delivered');

-- Unrouted topics dedupe too (the id is still an event id).
SELECT relay_publish('tap.nowhere', '{}', dedupe_key => 'tap-dd-nowhere') AS nowhere \gset
SELECT is(relay_publish('tap.nowhere', '{}', dedupe_key => 'tap-dd-nowhere'), :nowhere::bigint,
          'an unrouted publish with a dedupe_key returns its first id again');

-- The window.
SELECT is((SELECT expires_at - now() FROM relay.dedupe WHERE key = 'tap-dd-1'), interval '24 hours',
          'kept for relaybus.dedupe_window (24h by default)');
SET LOCAL relaybus.dedupe_window = '10min';
SELECT relay_publish('tap.dd.x', '{"n": 5}', dedupe_key => 'tap-dd-w');
SELECT is((SELECT expires_at - now() FROM relay.dedupe WHERE key = 'tap-dd-w'), interval '10 minutes',
          'relaybus.dedupe_window applies per transaction');
UPDATE relay.dedupe SET expires_at = now() - interval '1 second' WHERE key = 'tap-dd-1';
SELECT relay_publish('tap.dd.x', '{"n": 6}', 'tap-dd-k', dedupe_key => 'tap-dd-1') AS second \gset
SELECT isnt(:second::bigint, :first::bigint, 'after the window the same dedupe_key is a new event');
SELECT results_eq($$SELECT event_id, expires_at - now() FROM relay.dedupe WHERE key = 'tap-dd-1'$$,
                  format('VALUES (%s::bigint, interval ''10 minutes'')', :second),
                  'which the dedupe_key now names');
SELECT is(relay_publish('tap.dd.x', '{"n": 7}', dedupe_key => 'tap-dd-1'), :second::bigint, 'and dedupes again');

-- Batches.
SELECT relay_publish_batch('tap.dd.b', ARRAY['{"b": 1}', '{"b": 2}', '{"b": 3}', '{"b": 4}']::jsonb[],
                           dedupe_keys => ARRAY['tap-dd-b1', NULL, 'tap-dd-b1', 'tap-dd-2']) AS ids \gset
SELECT is((:'ids'::bigint[])[3], (:'ids'::bigint[])[1], 'a batch: a dedupe_key repeated in the batch gets the first id');
SELECT is((:'ids'::bigint[])[4], (SELECT event_id FROM relay.dedupe WHERE key = 'tap-dd-2'),
          'a batch: a dedupe_key used before gets the earlier id');
SELECT results_eq($$SELECT payload->>'b' FROM relay.deliveries WHERE topic = 'tap.dd.b' ORDER BY id$$,
                  ARRAY['1', '2'], 'a batch creates only the new events');
SELECT is(relay_publish_batch('tap.dd.b', ARRAY['{"b": 5}']::jsonb[], dedupe_keys => ARRAY['tap-dd-b1']),
          ARRAY[(:'ids'::bigint[])[1]], 'a later batch dedupes against it');
SELECT throws_ok($$SELECT relay_publish_batch('tap.dd.b', ARRAY['{}', '{}']::jsonb[], dedupe_keys => ARRAY['x'])$$,
                 '2202E', 'dedupe_keys must have as many elements as payloads', 'dedupe_keys of another length: 2202E');
SELECT throws_ok(format('SELECT relay_publish(%L, %L, dedupe_key => repeat(%L, 513))', 'tap.dd.x', '{}', 'x'),
                 '22001', 'dedupe_key is too long: 513 bytes', 'a dedupe_key longer than relaybus.max_key_bytes: 22001');
SELECT throws_ok($$SET LOCAL relaybus.dedupe_window = 0$$, '22023', NULL, 'relaybus.dedupe_window must be positive');

SET ROLE tap_dd_pub;
SELECT is(relay_publish('tap.dd.x', '{"n": 8}', dedupe_key => 'tap-dd-1'), :second::bigint,
          'relay_publisher: relay_publish with a dedupe_key');
SELECT throws_ok($$SELECT * FROM relay.dedupe$$, '42501', NULL, 'relay_publisher: cannot read relay.dedupe');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
