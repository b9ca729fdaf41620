--
-- Handlers and routes: relay_create_handler, relay_alter_handler (options
-- merging, secrets kept out of options), relay_drop_handler, relay_route,
-- relay_unroute. Objects are prefixed hnd_ / hnd. so that this file does not
-- depend on the others.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS relaybus;
RESET client_min_messages;
\set SHOW_CONTEXT never

CREATE TEMP VIEW hnd_h AS
SELECT name, kind, target, options, secrets
  FROM relay.handlers WHERE name LIKE 'hnd\_%';

-- create: one of each kind; the id is returned (and grows).
SELECT relay_create_handler('hnd_pull', 'pull') AS pull_id \gset
SELECT relay_create_handler('hnd_notify', 'notify', 'hnd_channel',
                            '{"ack": true, "concurrency": 4}') AS notify_id \gset
SELECT :notify_id > :pull_id AS ids_grow;
SELECT relay_create_handler('hnd_http', 'http', 'https://hooks.example.com/in?src=relay',
                            '{"timeout": "5s", "max_attempts": 3, "headers": {"X-Api-Key": "k1"},
                              "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}') > 0 AS created;
-- Options are stored as given, minus the secret, which goes to its own column.
SELECT * FROM hnd_h ORDER BY name;

-- Targets: a pull handler takes NULL or ''; stored as NULL either way.
SELECT relay_create_handler('hnd_pull.empty-target', 'pull', '') > 0 AS created;
SELECT relay_create_handler('hnd_pull_null_target', 'pull', NULL, NULL) > 0 AS created;
SELECT name, target, options FROM hnd_h WHERE name LIKE 'hnd\_pull%' ORDER BY name;

-- Valid names, channels and URLs at the edges of their rules.
SELECT relay_create_handler('hnd_' || repeat('x', 59), 'pull') > 0 AS name_63_bytes;
SELECT relay_create_handler('hnd_a.b-c_9', 'notify', '_' || repeat('Z', 62)) > 0 AS channel_63_bytes;
SELECT relay_create_handler('hnd_url1', 'http', 'http://localhost:8080') > 0 AS created;
SELECT relay_create_handler('hnd_url2', 'http', 'https://[::1]:8443/a/b%20c') > 0 AS created;
SELECT relay_create_handler('hnd_url3', 'http', 'HTTP://10.0.0.1/x?y=1&z=2') > 0 AS created;
SELECT name, kind, target FROM hnd_h
 WHERE name LIKE 'hnd\_url%' OR name LIKE 'hnd\_a.%' OR length(name) = 63 ORDER BY name;

-- Every option at a valid value, per kind.
SELECT relay_create_handler('hnd_all_pull', 'pull', NULL,
         '{"max_attempts": 1000, "backoff_base": "1ms", "backoff_max": "7d", "lease": "1s"}') > 0 AS created;
SELECT relay_create_handler('hnd_all_notify', 'notify', 'ch',
         '{"max_attempts": 1, "backoff_base": "1d", "backoff_max": "1d", "lease": "1d",
           "concurrency": 1024, "ack": false}') > 0 AS created;
SELECT relay_create_handler('hnd_all_http', 'http', 'http://h',
         '{"max_attempts": 10.0, "backoff_base": "500 ms", "backoff_max": "5 min", "lease": "30s",
           "concurrency": 1, "timeout": "1h",
           "secret": ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3"],
           "headers": {"Authorization": "Bearer t", "X-Empty": ""}}') > 0 AS created;
SELECT name, options, secrets FROM hnd_h WHERE name LIKE 'hnd\_all%' ORDER BY name;
-- null restores a default, whatever the option: accepted even for another kind.
SELECT relay_create_handler('hnd_nulls', 'pull', NULL, '{"timeout": null, "max_attempts": null}') > 0 AS created;
SELECT relay_alter_handler('hnd_nulls', options => '{"lease": null, "ack": null}');
SELECT name, options FROM hnd_h WHERE name = 'hnd_nulls';

-- alter: options are merged into the current ones; null removes one.
SELECT relay_alter_handler('hnd_http', options => '{"max_attempts": 5, "concurrency": 8}');
SELECT options, secrets FROM hnd_h WHERE name = 'hnd_http';
SELECT relay_alter_handler('hnd_http', options => '{"timeout": null, "headers": {"X-Api-Key": "k2"}}');
SELECT options, secrets FROM hnd_h WHERE name = 'hnd_http';
-- The secret survives alters that do not mention it; it can be rotated
-- (an array of secrets) and removed, and never appears among the options.
SELECT relay_alter_handler('hnd_http', options => '{"secret": ["whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]}');
SELECT options, secrets FROM hnd_h WHERE name = 'hnd_http';
SELECT relay_alter_handler('hnd_http', target => 'http://other.example.com:81/');
SELECT target, options, secrets FROM hnd_h WHERE name = 'hnd_http';
SELECT relay_alter_handler('hnd_http', options => '{"secret": null}');
SELECT target, options, secrets FROM hnd_h WHERE name = 'hnd_http';
SELECT count(*) AS handlers_with_secret_in_options FROM relay.handlers WHERE options ? 'secret';
-- Neither target nor options: nothing changes but updated_at.
SELECT relay_alter_handler('hnd_http');
SELECT target, options, secrets, updated_at > created_at AS touched
  FROM relay.handlers WHERE name = 'hnd_http';
-- The target of a notify handler; options of a pull handler.
SELECT relay_alter_handler('hnd_notify', 'hnd_other_channel', '{"ack": false}');
SELECT relay_alter_handler('hnd_pull', options => '{"lease": "2 min", "max_attempts": 2}');
SELECT name, kind, target, options FROM hnd_h WHERE name IN ('hnd_notify', 'hnd_pull') ORDER BY name;
-- A failed alter changes nothing (the merged options are validated as a whole).
SELECT relay_alter_handler('hnd_pull', options => '{"backoff_base": "1h", "backoff_max": "1min"}');
SELECT name, options FROM hnd_h WHERE name = 'hnd_pull';

-- Routes: patterns and wire names; routing a pair again changes the wire name.
-- (The notify and http handlers get topics nothing below publishes: the
-- background workers would hand their deliveries over.)
SELECT relay_route('hnd.order.created', 'hnd_pull');
SELECT relay_route('hnd.order.*', 'hnd_pull', 'orders');
SELECT relay_route('hnd.audit.#', 'hnd_notify');
SELECT relay_route('*.payment.#', 'hnd_http', 'any-payment.v1');
SELECT relay_route('#', 'hnd_all_pull');
SELECT relay_route('hnd.order.*', 'hnd_pull', 'orders.v2');
CREATE TEMP VIEW hnd_r AS
SELECT r.pattern, h.name AS handler, r.wire_name
  FROM relay.routes r JOIN relay.handlers h ON h.id = r.handler_id
 WHERE h.name LIKE 'hnd\_%';
SELECT * FROM hnd_r ORDER BY handler, pattern;
SELECT relay_route('hnd.order.*', 'hnd_pull');
SELECT * FROM hnd_r WHERE handler = 'hnd_pull' ORDER BY pattern;
SELECT relay_unroute('hnd.order.*', 'hnd_pull') AS removed;
SELECT relay_unroute('hnd.order.*', 'hnd_pull') AS removed;
SELECT relay_unroute('hnd.no.such.route', 'hnd_notify') AS removed;
SELECT * FROM hnd_r ORDER BY handler, pattern;

-- drop: a handler without deliveries; its routes go with it.
SELECT relay_drop_handler('hnd_all_pull');
SELECT count(*) AS routes_of_dropped FROM hnd_r WHERE handler = 'hnd_all_pull';
-- With pending deliveries: refused (55006, see errors.sql), or deleted with force;
-- the handler's dead letters stay.
SELECT relay_publish('hnd.order.created', '{"n": 1}', 'hnd-k') IS NOT NULL AS published;
SELECT relay_publish('hnd.order.created', '{"n": 2}', 'hnd-k') IS NOT NULL AS published;
SELECT relay_publish('hnd.order.created', '{"n": 3}', 'hnd-k') IS NOT NULL AS published;
SELECT payload FROM relay_claim('hnd_pull', 1);
SELECT relay_nack(d.id, 'failed once', '0s') FROM relay.deliveries d
  JOIN relay.handlers h ON h.id = d.handler_id WHERE h.name = 'hnd_pull' AND d.seq = 1;
SELECT payload FROM relay_claim('hnd_pull', 1);
SELECT relay_nack(d.id, 'failed twice') FROM relay.deliveries d
  JOIN relay.handlers h ON h.id = d.handler_id WHERE h.name = 'hnd_pull' AND d.seq = 1;
SELECT handler, kind, pending, dead FROM relay.handler_stats WHERE handler = 'hnd_pull';
SELECT relay_drop_handler('hnd_pull', force => true);
SELECT h.name AS handler, count(*) AS deliveries_left
  FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id
 WHERE d.key = 'hnd-k' GROUP BY h.name ORDER BY h.name;
SELECT handler, topic, key, seq, attempts, last_error, payload FROM relay.dead_letters
 WHERE handler = 'hnd_pull';
-- A replay ignores dead letters whose handler is gone.
SELECT relay_replay(NULL, array(SELECT id FROM relay.dead_letters WHERE handler = 'hnd_pull')) AS replayed;
-- The name can be used again; the new handler does not inherit anything.
SELECT relay_create_handler('hnd_pull', 'pull') > 0 AS created;
SELECT * FROM hnd_h WHERE name = 'hnd_pull';
SELECT count(*) AS routes FROM hnd_r WHERE handler = 'hnd_pull';
SELECT handler, kind, pending, dead FROM relay.handler_stats WHERE handler = 'hnd_pull';

-- Clean up.
SELECT relay_drop_handler(name, true) FROM relay.handlers WHERE name LIKE 'hnd\_%' ORDER BY name;
DELETE FROM relay.dead_letters WHERE handler LIKE 'hnd\_%';
DELETE FROM relay.key_seqs WHERE key LIKE 'hnd-%';
DROP VIEW hnd_r;
DROP VIEW hnd_h;
