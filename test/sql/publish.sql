--
-- relay_publish / relay_publish_batch: returned ids, fan-out to routed
-- handlers, wire names, per-key seq, lanes, and what a delivery row carries.
--
-- Every object here is prefixed pub_ / pub. / pub- so this file does not depend
-- on the other files of the suite; event and delivery ids are shown relative
-- to a baseline taken at the start.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS relaybus;
RESET client_min_messages;
\set SHOW_CONTEXT never
SELECT nextval('relay.event_id_seq') AS ev0 \gset
SELECT nextval('relay.delivery_id_seq') AS dl0 \gset

-- A view of this file's deliveries with stable columns only.
CREATE TEMP VIEW pub_d AS
SELECT d.id - :dl0 AS rel_id, d.event_id - :ev0 AS rel_event, h.name AS handler,
       d.topic, d.wire_topic, d.key, d.seq, d.attempt, d.priority, d.payload, d.headers
  FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id
 WHERE h.name LIKE 'pub\_%';

-- A topic without any route: an id is still drawn, no delivery is written.
SELECT relay_publish('pub.unrouted', '{"n": 0}') - :ev0 AS rel_event;
SELECT count(*) AS deliveries FROM relay.deliveries WHERE topic = 'pub.unrouted';

-- Three pull handlers: an exact route, a '*' route with a wire name, a '#' route.
SELECT relay_create_handler('pub_exact', 'pull') > 0 AS created;
SELECT relay_create_handler('pub_star', 'pull') > 0 AS created;
SELECT relay_create_handler('pub_hash', 'pull') > 0 AS created;
SELECT relay_route('pub.order.created', 'pub_exact');
SELECT relay_route('pub.order.*', 'pub_star', 'orders.v1');
SELECT relay_route('pub.#', 'pub_hash');
SELECT r.pattern, h.name AS handler, r.wire_name
  FROM relay.routes r JOIN relay.handlers h ON h.id = r.handler_id
 WHERE h.name LIKE 'pub\_%' ORDER BY r.pattern;

-- Fan-out: one event, one delivery per matching handler, all with its event id.
SELECT relay_publish('pub.order.created', '{"order": 1}') - :ev0 AS rel_event;
SELECT * FROM pub_d ORDER BY rel_id;
-- 'pub.order.*' matches one segment only; 'pub.#' matches any number.
SELECT relay_publish('pub.order', '{"order": 2}') - :ev0 AS rel_event;
SELECT relay_publish('pub.order.created.v2', '{"order": 3}') - :ev0 AS rel_event;
SELECT relay_publish('pub.order.paid', '{"order": 4}') - :ev0 AS rel_event;
SELECT rel_event, handler, topic, wire_topic FROM pub_d WHERE rel_event IN (2, 3, 4)
 ORDER BY rel_event, handler;

-- Routing the same pair again changes the wire name (for later events only).
SELECT relay_route('pub.order.*', 'pub_star', 'orders.v2');
SELECT relay_publish('pub.order.shipped', '{"order": 5}') - :ev0 AS rel_event;
SELECT rel_event, handler, topic, wire_topic FROM pub_d WHERE handler = 'pub_star'
 ORDER BY rel_event;
-- Unrouting: true when a route was removed, false when there was none.
SELECT relay_unroute('pub.order.created', 'pub_exact') AS removed;
SELECT relay_unroute('pub.order.created', 'pub_exact') AS removed_again;
SELECT relay_publish('pub.order.created', '{"order": 6}') - :ev0 AS rel_event;
SELECT rel_event, handler, topic, wire_topic FROM pub_d WHERE rel_event = 7 ORDER BY handler;

-- Keys: seq is per key across all topics, 1, 2, 3, ...; unkeyed events have none.
SELECT relay_publish('pub.a', '{"k": 1}', 'pub-k1') - :ev0 AS rel_event;
SELECT relay_publish('pub.b', '{"k": 2}', 'pub-k1') - :ev0 AS rel_event;
SELECT relay_publish('pub.a', '{"k": 3}', 'pub-k2') - :ev0 AS rel_event;
SELECT relay_publish('pub.c.d', '{"k": 4}', 'pub-k1') - :ev0 AS rel_event;
SELECT relay_publish('pub.a', '{"k": 5}') - :ev0 AS rel_event;
SELECT rel_event, topic, key, seq, payload FROM pub_d WHERE rel_event >= 8 ORDER BY rel_event;
-- An event no handler receives is written nowhere: it does not advance its
-- key's counter either (pub-k3 has no counter row).
SELECT relay_publish('pub_unrouted_topic', '{}', 'pub-k3') - :ev0 AS rel_event;
SELECT key, seq FROM relay.key_seqs WHERE key LIKE 'pub-%' ORDER BY key;

-- A rolled back publish leaves nothing: no delivery and no gap in seq.
BEGIN;
SELECT relay_publish('pub.a', '{"k": "rolled back"}', 'pub-k1') IS NOT NULL AS published;
SELECT count(*) AS deliveries_in_tx FROM pub_d WHERE payload = '{"k": "rolled back"}';
ROLLBACK;
SELECT count(*) AS deliveries_after_rollback FROM pub_d WHERE payload = '{"k": "rolled back"}';
SELECT relay_publish('pub.a', '{"k": 6}', 'pub-k1') - :ev0 AS rel_event;
SELECT key, seq, payload FROM pub_d WHERE payload = '{"k": 6}';

-- Batch: ids in order (one per payload), seq continues per key in batch order,
-- repeated keys take consecutive seqs, NULL keys are unkeyed.
SELECT array(SELECT x - :ev0 FROM unnest(relay_publish_batch('pub.batch',
         ARRAY['{"b": 1}', '{"b": 2}', '{"b": 3}', '{"b": 4}', '{"b": 5}']::jsonb[],
         ARRAY['pub-k1', 'pub-k4', NULL, 'pub-k1', 'pub-k4'])) AS x) AS rel_events;
SELECT rel_event, key, seq, payload FROM pub_d WHERE topic = 'pub.batch' ORDER BY rel_event;
-- Batch without keys; an empty batch; a batch of an unrouted topic.
SELECT array(SELECT x - :ev0 FROM unnest(relay_publish_batch('pub.batch2',
         ARRAY['{"b": 6}', '{"b": 7}']::jsonb[])) AS x) AS rel_events;
SELECT rel_event, key, seq, payload FROM pub_d WHERE topic = 'pub.batch2' ORDER BY rel_event;
SELECT relay_publish_batch('pub.batch3', '{}'::jsonb[]) AS empty_batch;
SELECT array(SELECT x - :ev0 FROM unnest(relay_publish_batch('pub_unrouted_topic',
         ARRAY['{}', '{}']::jsonb[], ARRAY['pub-k3', 'pub-k3'])) AS x) AS rel_events;
SELECT key, seq FROM relay.key_seqs WHERE key LIKE 'pub-%' ORDER BY key;
-- A batch fans out like single publishes: one delivery per event and handler.
SELECT relay_route('pub.fan', 'pub_star', 'fan.wire');
SELECT relay_route('pub.fan', 'pub_exact');
SELECT array(SELECT x - :ev0 FROM unnest(relay_publish_batch('pub.fan',
         ARRAY['{"f": 1}', '{"f": 2}']::jsonb[], ARRAY['pub-k5', 'pub-k5'],
         headers => '{"h": "v"}', priority => 2)) AS x) AS rel_events;
SELECT rel_event, handler, topic, wire_topic, key, seq, priority, payload, headers
  FROM pub_d WHERE topic = 'pub.fan' ORDER BY handler, rel_event;
-- Within one handler, delivery ids follow seq.
SELECT handler, bool_and(rn_id = rn_seq) AS id_order_is_seq_order
  FROM (SELECT handler, row_number() OVER (PARTITION BY handler ORDER BY rel_id) AS rn_id,
               row_number() OVER (PARTITION BY handler ORDER BY seq) AS rn_seq
          FROM pub_d WHERE key = 'pub-k1') s
 GROUP BY handler ORDER BY handler;

-- Headers, priority and not_before are stored as given; published_at and the
-- default not_before are the transaction's time.
BEGIN;
SELECT relay_publish('pub.meta', '{"m": 1}', 'pub-k6', '{"trace": "abc", "n": 1}', 3,
                     '2100-01-01 00:00:00+00') - :ev0 AS rel_event;
SELECT relay_publish('pub.meta', '{"m": 2}', priority => 0) - :ev0 AS rel_event;
SELECT payload, key, headers, priority, not_before = '2100-01-01 00:00:00+00' AS not_before_as_given,
       published_at = now() AS published_now
  FROM relay.deliveries WHERE topic = 'pub.meta' AND not_before > now();
SELECT payload, key, headers, priority, not_before = now() AS ready_now,
       published_at = now() AS published_now
  FROM relay.deliveries WHERE topic = 'pub.meta' AND not_before <= now();
COMMIT;

-- Payloads: any JSON value (not only objects); stored as jsonb.
SELECT relay_publish('pub.json', v) IS NOT NULL AS published
  FROM (VALUES ('[1, 2]'::jsonb), ('"text"'), ('42'), ('null'), ('{"nested": {"a": [true]}}')) AS t(v);
SELECT payload, jsonb_typeof(payload) FROM pub_d WHERE topic = 'pub.json' ORDER BY rel_event;

-- Lanes: a keyed delivery's lane is relay.lane_of(key) (FNV-1a 64 mod 64); an
-- unkeyed one's is its event id mod 64.
SELECT k, relay.lane_of(k) AS lane
  FROM (VALUES (''), ('a'), ('order-42'), ('customer:1'), ('tenant/7/order/9001'),
               ('ключ'), ('日本'), ('café')) AS t(k);
SELECT relay.lane_of(NULL) IS NULL AS strict;
SELECT count(*) FILTER (WHERE d.key IS NOT NULL) AS keyed,
       count(*) FILTER (WHERE d.key IS NOT NULL AND d.lane = relay.lane_of(d.key)) AS keyed_lane_ok,
       count(*) FILTER (WHERE d.key IS NULL) AS unkeyed,
       count(*) FILTER (WHERE d.key IS NULL AND d.lane = d.event_id % 64) AS unkeyed_lane_ok
  FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id
 WHERE h.name LIKE 'pub\_%';

-- relay.handler_stats counts what is pending per handler.
SELECT handler, kind, pending, ready, delayed, in_flight, retrying, dead
  FROM relay.handler_stats WHERE handler LIKE 'pub\_%' ORDER BY handler;

-- Clean up.
SELECT relay_drop_handler(name, force => true)
  FROM relay.handlers WHERE name LIKE 'pub\_%' ORDER BY name;
DELETE FROM relay.key_seqs WHERE key LIKE 'pub-%';
SELECT count(*) AS left_over FROM relay.deliveries WHERE topic LIKE 'pub%';
DROP VIEW pub_d;
