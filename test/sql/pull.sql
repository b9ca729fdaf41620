--
-- Pull consumers: relay_claim (heads of keys, runs with per_key, leases,
-- delays, priorities, wire names), relay_ack, relay_nack (retry, dead letter),
-- relay_replay. Objects are prefixed pul_ / pul. so that this file does not
-- depend on the others; delivery ids are shown relative to a baseline.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS relaybus;
RESET client_min_messages;
\set SHOW_CONTEXT never
SET relaybus.priority_aging = 0;
SELECT nextval('relay.delivery_id_seq') AS dl0 \gset

-- The id of this file's delivery whose payload is {"n": N}.
CREATE FUNCTION pg_temp.pid(n int) RETURNS bigint LANGUAGE sql AS $$
    SELECT d.id FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id
     WHERE h.name LIKE 'pul\_%' AND d.payload->>'n' = n::text
$$;
-- Claim and show the stable columns, in hand-over order.
CREATE FUNCTION pg_temp.claim(handler text, max int DEFAULT 100, per_key int DEFAULT 1,
                              lease interval DEFAULT NULL)
RETURNS TABLE (rel_id bigint, n int, topic text, key text, seq bigint, attempt int,
               priority int, headers jsonb)
LANGUAGE sql AS $$
    SELECT c.id - current_setting('pul.dl0')::bigint, (c.payload->>'n')::int, c.topic, c.key,
           c.seq, c.attempt, c.priority, c.headers
      FROM relay_claim(handler, max, lease, per_key) c
$$;
SELECT set_config('pul.dl0', :'dl0', false) IS NOT NULL AS ok;

SELECT relay_create_handler('pul_q', 'pull', NULL, '{"max_attempts": 3}') > 0 AS created;
SELECT relay_route('pul.#', 'pul_q');

-- Nothing to claim yet.
SELECT * FROM pg_temp.claim('pul_q');

-- Keys k1 (3 events), k2 (2 events) and two unkeyed events, in one transaction.
BEGIN;
SELECT relay_publish('pul.a', '{"n": 1}', 'pul-k1'),
       relay_publish('pul.b', '{"n": 2}', 'pul-k2'),
       relay_publish('pul.a', '{"n": 3}', 'pul-k1'),
       relay_publish('pul.c', '{"n": 4}'),
       relay_publish('pul.a', '{"n": 5}', 'pul-k1'),
       relay_publish('pul.b', '{"n": 6}', 'pul-k2', '{"h": 1}'),
       relay_publish('pul.c', '{"n": 7}') \gset
COMMIT;

-- per_key 1 (the default): the head of each key and every unkeyed delivery,
-- oldest first; max limits how many.
SELECT * FROM pg_temp.claim('pul_q', max => 2);
SELECT * FROM pg_temp.claim('pul_q');
-- They are leased now: nothing more, as every later delivery waits for its head.
SELECT * FROM pg_temp.claim('pul_q');
SELECT handler, pending, ready, delayed, in_flight, retrying, dead
  FROM relay.handler_stats WHERE handler = 'pul_q';
-- The lease is the handler's (default 30s), held in shared memory only.
SELECT count(*) AS leases,
       bool_and(l.lease_until > clock_timestamp() + interval '25 s'
                AND l.lease_until <= clock_timestamp() + interval '30 s') AS about_30s
  FROM relay._leases() l JOIN relay.handlers h ON h.id = l.handler_id WHERE h.name = 'pul_q';

-- Acking a head makes the next delivery of its key claimable.
SELECT relay_ack(ARRAY[pg_temp.pid(1)]) AS acked;
SELECT * FROM pg_temp.claim('pul_q');
-- Acks: several at once, duplicates count once, an empty array acks nothing.
SELECT relay_ack(ARRAY[pg_temp.pid(2), pg_temp.pid(4), pg_temp.pid(7), pg_temp.pid(2)]) AS acked;
SELECT relay_ack('{}') AS acked;
SELECT * FROM pg_temp.claim('pul_q');
SELECT relay_ack(ARRAY[pg_temp.pid(3), pg_temp.pid(6)]) AS acked;
SELECT * FROM pg_temp.claim('pul_q');
SELECT relay_ack(ARRAY[pg_temp.pid(5)]) AS acked;
SELECT count(*) AS pending FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id
 WHERE h.name = 'pul_q';
SELECT count(*) AS leases FROM relay._leases() l JOIN relay.handlers h ON h.id = l.handler_id
 WHERE h.name = 'pul_q';

-- per_key N takes a run of up to N consecutive deliveries of a key; max still
-- counts every delivery.
SELECT relay_publish_batch('pul.run', array(SELECT jsonb_build_object('n', i) FROM generate_series(11, 16) i),
                           ARRAY['pul-k3', 'pul-k3', 'pul-k4', 'pul-k3', 'pul-k3', 'pul-k4']) IS NOT NULL AS published;
SELECT * FROM pg_temp.claim('pul_q', max => 4, per_key => 3);
-- 15 waits behind k3's leased run, 16 behind 13.
SELECT * FROM pg_temp.claim('pul_q', per_key => 10);
-- A failed run: the consumer nacks the failed one and leaves the rest of its key
-- (their leases lapse); the rest stays behind the failed one.
SELECT relay_nack(pg_temp.pid(11), 'boom', '1 hour') AS outcome;
SELECT (payload->>'n')::int AS n, attempt, last_error, not_before > now() + interval '59 min' AS delayed
  FROM relay.deliveries WHERE id = pg_temp.pid(11);
SELECT * FROM pg_temp.claim('pul_q', per_key => 10);
-- Only a lease's holder completes: once the hour is over (the test moves it
-- on), the head is claimed again (attempt 2; 12 and 14 are still leased, so
-- only the head comes); a nack with retry_in '0s' makes it ready again at once.
UPDATE relay.deliveries SET not_before = now() WHERE id = pg_temp.pid(11);
SELECT * FROM pg_temp.claim('pul_q', per_key => 10);
SELECT relay_nack(pg_temp.pid(11), 'boom again', '0s') AS outcome;
SELECT * FROM pg_temp.claim('pul_q', per_key => 10);
-- The third failure (max_attempts 3) moves it to the dead letters and frees its key.
SELECT relay_nack(pg_temp.pid(11), 'gave up') AS outcome;
SELECT (payload->>'n')::int AS n, handler, topic, key, seq, attempts, last_error, last_status
  FROM relay.dead_letters WHERE handler = 'pul_q';
SELECT count(*) AS pending FROM relay.deliveries WHERE payload = '{"n": 11}';
SELECT relay_ack(ARRAY[pg_temp.pid(12), pg_temp.pid(14), pg_temp.pid(13)]) AS acked;
SELECT * FROM pg_temp.claim('pul_q', per_key => 10);
SELECT relay_ack(ARRAY[pg_temp.pid(15), pg_temp.pid(16)]) AS acked;
SELECT handler, pending, in_flight, retrying, dead FROM relay.handler_stats WHERE handler = 'pul_q';

-- Replay: the dead letter is delivered again with its id and seq and a fresh
-- attempt count, as the head of its key.
SELECT relay_publish('pul.run', '{"n": 17}', 'pul-k3') IS NOT NULL AS published;
SELECT relay_replay('pul_q') AS replayed;
SELECT count(*) AS dead FROM relay.dead_letters WHERE handler = 'pul_q';
SELECT * FROM pg_temp.claim('pul_q', per_key => 10);
SELECT relay_ack(ARRAY[pg_temp.pid(11), pg_temp.pid(17)]) AS acked;
-- Replay by ids; ids that are not dead letters are ignored; handler NULL = all.
SELECT relay_publish('pul.x', '{"n": 18}') IS NOT NULL AS published;
SELECT relay_nack(id, 'x', '0s') AS first FROM relay_claim('pul_q');
SELECT relay_nack(id, 'x', '0s') AS second FROM relay_claim('pul_q');
SELECT relay_nack(id, 'x', '0s') AS third FROM relay_claim('pul_q');
SELECT id AS dead_id FROM relay.dead_letters WHERE handler = 'pul_q' \gset
SELECT relay_replay(NULL, ARRAY[-1::bigint]) AS replayed;
SELECT relay_replay(NULL, ARRAY[:dead_id]) AS replayed;
SELECT relay_replay('pul_q') AS replayed;
SELECT * FROM pg_temp.claim('pul_q');
SELECT relay_ack(ARRAY[pg_temp.pid(18)]) AS acked;

-- Delays: a future not_before is not claimable and holds back its key only.
SELECT relay_publish('pul.d', '{"n": 21}', 'pul-k5', not_before => now() + interval '1 hour') IS NOT NULL,
       relay_publish('pul.d', '{"n": 22}', 'pul-k5') IS NOT NULL,
       relay_publish('pul.d', '{"n": 23}', 'pul-k6') IS NOT NULL;
SELECT handler, pending, ready, delayed FROM relay.handler_stats WHERE handler = 'pul_q';
SELECT * FROM pg_temp.claim('pul_q', per_key => 10);
SELECT relay_ack(ARRAY[pg_temp.pid(23)]) AS acked;
SELECT relay_drop_handler('pul_q', force => true);

-- Priorities (aging off): class 3 first, then 2, 1, 0, across keys; never
-- within a key (k7's class 3 event waits for its class 0 head).
SELECT relay_create_handler('pul_prio', 'pull') > 0 AS created;
SELECT relay_route('pul.p', 'pul_prio');
SELECT relay_publish('pul.p', '{"n": 31}', 'pul-k7', priority => 0) IS NOT NULL,
       relay_publish('pul.p', '{"n": 32}', 'pul-k8', priority => 1) IS NOT NULL,
       relay_publish('pul.p', '{"n": 33}', 'pul-k7', priority => 3) IS NOT NULL,
       relay_publish('pul.p', '{"n": 34}', NULL, priority => 2) IS NOT NULL,
       relay_publish('pul.p', '{"n": 35}', 'pul-k9', priority => 3) IS NOT NULL;
SELECT * FROM pg_temp.claim('pul_prio', max => 1);
SELECT * FROM pg_temp.claim('pul_prio', max => 1);
SELECT * FROM pg_temp.claim('pul_prio');
SELECT relay_ack(ARRAY[pg_temp.pid(31)]) AS acked;
SELECT * FROM pg_temp.claim('pul_prio');
SELECT relay_drop_handler('pul_prio', force => true);

-- The wire name replaces the topic in what a consumer sees; the lease comes
-- from the handler's option unless claim passes one.
SELECT relay_create_handler('pul_wire', 'pull', NULL,
                            '{"lease": "2 min", "backoff_base": "1ms", "backoff_max": "1ms"}') > 0 AS created;
SELECT relay_route('pul.w.*', 'pul_wire', 'wire.name');
SELECT relay_route('pul.w.exact', 'pul_wire');
SELECT relay_publish('pul.w.one', '{"n": 41}', headers => '{"trace": "t1"}') IS NOT NULL,
       relay_publish('pul.w.exact', '{"n": 42}') IS NOT NULL,
       relay_publish('pul.w.two', '{"n": 43}') IS NOT NULL;
SELECT (payload->>'n')::int AS n, topic, headers,
       lease_until > clock_timestamp() + interval '115 s'
       AND lease_until <= clock_timestamp() + interval '120 s' AS about_2min
  FROM relay_claim('pul_wire', 2) ORDER BY n;
SELECT (payload->>'n')::int AS n, topic,
       lease_until > clock_timestamp() + interval '15 s'
       AND lease_until <= clock_timestamp() + interval '20 s' AS about_20s
  FROM relay_claim('pul_wire', lease => '20s');

-- An ack in a transaction that rolls back acks nothing and keeps the lease:
-- the delivery comes back only when the lease runs out (the exactly-once
-- pattern: the consumer's own writes and the ack commit or roll back together).
CREATE TEMP TABLE pul_done (n int PRIMARY KEY);
SELECT relay_publish('pul.w.exact', '{"n": 44}') IS NOT NULL,
       relay_publish('pul.w.exact', '{"n": 45}') IS NOT NULL;
SELECT * FROM pg_temp.claim('pul_wire', lease => '1s');
BEGIN;
INSERT INTO pul_done VALUES (41), (44);
SELECT relay_ack(ARRAY[pg_temp.pid(41), pg_temp.pid(44)]) AS acked;
ROLLBACK;
-- The same with a savepoint that rolls back in a transaction that commits.
BEGIN;
SAVEPOINT s;
INSERT INTO pul_done VALUES (45);
SELECT relay_ack(ARRAY[pg_temp.pid(45)]) AS acked;
ROLLBACK TO SAVEPOINT s;
COMMIT;
SELECT count(*) AS done FROM pul_done;
SELECT (payload->>'n')::int AS n FROM relay.deliveries
 WHERE id IN (pg_temp.pid(41), pg_temp.pid(44), pg_temp.pid(45)) ORDER BY n;
-- Their leases are still held (41 for 2 minutes): nothing to claim ...
SELECT (SELECT (payload->>'n')::int FROM relay.deliveries d WHERE d.id = l.delivery_id) AS n
  FROM relay._leases() l WHERE l.delivery_id IN (pg_temp.pid(41), pg_temp.pid(44), pg_temp.pid(45))
 ORDER BY n;
SELECT * FROM pg_temp.claim('pul_wire');
-- ... until the 1s leases of 44 and 45 run out: the next claim charges each a
-- failed attempt ('lease expired', the handler's backoff of 1ms) and hands
-- nothing over; the one after gets them again, attempt 2.
SELECT pg_sleep(1.2);
SELECT * FROM pg_temp.claim('pul_wire');
SELECT (payload->>'n')::int AS n, attempt, last_error FROM relay.deliveries
 WHERE id IN (pg_temp.pid(44), pg_temp.pid(45)) ORDER BY n;
SELECT pg_sleep(0.01);
SELECT * FROM pg_temp.claim('pul_wire');
-- Committed: done once, and the leases are gone.
BEGIN;
INSERT INTO pul_done SELECT i FROM generate_series(41, 45) i;
SELECT relay_ack(array(SELECT pg_temp.pid(i) FROM generate_series(41, 45) i)) AS acked;
COMMIT;
SELECT n FROM pul_done ORDER BY n;
SELECT count(*) AS leases FROM relay._leases() l JOIN relay.handlers h ON h.id = l.handler_id
 WHERE h.name = 'pul_wire';
SELECT * FROM pg_temp.claim('pul_wire');

-- Clean up.
SELECT relay_drop_handler('pul_wire');
DELETE FROM relay.key_seqs WHERE key LIKE 'pul-%';
DROP TABLE pul_done;
