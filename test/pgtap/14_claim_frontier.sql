-- relay_claim of a pull handler with a small max: the claim frontier
-- (docs/architecture.md, "The claim frontier") starts a busy handler's scans
-- past the rows taken or held. A key whose head is held below it must still
-- count as blocked: its next delivery is not taken for a head, and the claim
-- returns the ready delivery of another key at once instead of nothing.
BEGIN;
SELECT plan(12);
SET LOCAL relaybus.priority_aging = 0;

CREATE FUNCTION pg_temp.claim(handler text, max int DEFAULT 1, per_key int DEFAULT 1)
RETURNS SETOF text LANGUAGE sql AS $$
    SELECT coalesce(c.key || ':' || c.seq, '-:' || (c.payload->>'n'))
      FROM relay_claim(handler, max, NULL, per_key) c
$$;
CREATE FUNCTION pg_temp.id_of(k text, s bigint) RETURNS bigint LANGUAGE sql AS $$
    SELECT id FROM relay.deliveries WHERE key = k AND seq = s
$$;

-- ---------------------------------------------------------------- a follower seen by the claim
SELECT relay_create_handler('tap_f1', 'pull');
SELECT relay_route('tap.f1', 'tap_f1');
SELECT relay_publish('tap.f1', '{"n": 1}', 'tap-k1');
SELECT relay_publish('tap.f1', '{"n": 2}', 'tap-k1');
SELECT relay_publish('tap.f1', '{"n": 3}', 'tap-k2');
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_f1')$$, ARRAY['tap-k1:1'], 'max 1: k1 seq 1');
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_f1')$$, ARRAY['tap-k2:1'],
                  'the next claim returns k2 at once: k1 seq 2 waits for its leased head');
SELECT relay_publish('tap.f1', '{"n": 4}', NULL);
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_f1')$$, ARRAY['-:4'],
                  'an unkeyed delivery published after is returned by the next claim');
SELECT is_empty($$SELECT * FROM pg_temp.claim('tap_f1')$$, 'nothing else is ready');
SELECT is(relay_ack(ARRAY[pg_temp.id_of('tap-k1', 1)]), 1, 'ack k1 seq 1');
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_f1')$$, ARRAY['tap-k1:2'],
                  'then k1 seq 2 at once');

-- ---------------------------------------------------------------- a follower published later
SELECT relay_create_handler('tap_f2', 'pull');
SELECT relay_route('tap.f2', 'tap_f2');
SELECT relay_publish('tap.f2', '{"n": 1}', 'tap-k3');
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_f2')$$, ARRAY['tap-k3:1'], 'k3 seq 1');
SELECT relay_publish('tap.f2', '{"n": 2}', 'tap-k3');
SELECT relay_publish('tap.f2', '{"n": 3}', NULL);
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_f2')$$, ARRAY['-:3'],
                  'k3 seq 2, published after its head was claimed, waits; the unkeyed delivery does not');
SELECT relay_publish('tap.f2', '{"n": 4}', NULL);
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_f2')$$, ARRAY['-:4'], 'and the next one neither');
SELECT is(relay_ack(ARRAY[pg_temp.id_of('tap-k3', 1)]), 1, 'ack k3 seq 1');
SELECT results_eq($$SELECT * FROM pg_temp.claim('tap_f2')$$, ARRAY['tap-k3:2'],
                  'then k3 seq 2 at once');
SELECT is_empty($$SELECT * FROM pg_temp.claim('tap_f2')$$, 'nothing else is ready');

SELECT * FROM finish();
ROLLBACK;
