--
-- Every bad input of docs/sql-api.md, with its SQLSTATE and message.
--
-- pg_temp.try(sql) runs one call and returns 'ok' or 'SQLSTATE: message'; it
-- compares the whole bus (deliveries, dead letters, handlers, routes, key
-- counters and leases) before and after the call and appends ' [bus changed]'
-- if anything differs, so every line below also shows that the failed call
-- wrote nothing. Each section runs in a transaction: after the calls the
-- transaction rolls back to a savepoint and shows that it still works. The last
-- section raises the errors for real (psql shows only the SQLSTATE).
-- Objects are prefixed err_ / err. so that this file does not depend on the others.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS relaybus;
RESET client_min_messages;
\set SHOW_CONTEXT never
SET relaybus.priority_aging = 0;

CREATE FUNCTION pg_temp.bus_state() RETURNS text LANGUAGE sql AS $$
    SELECT md5(concat_ws('|',
        (SELECT string_agg(d::text, ',' ORDER BY d.id) FROM relay.deliveries d),
        (SELECT string_agg(x::text, ',' ORDER BY x.id) FROM relay.dead_letters x),
        (SELECT string_agg(h::text, ',' ORDER BY h.id) FROM relay.handlers h),
        (SELECT string_agg(r::text, ',' ORDER BY r.pattern, r.handler_id) FROM relay.routes r),
        (SELECT string_agg(k::text, ',' ORDER BY k.key) FROM relay.key_seqs k),
        (SELECT string_agg(l.delivery_id || '@' || l.lease_until, ',' ORDER BY l.delivery_id)
           FROM relay._leases() l)))
$$;
-- Delivery ids named in messages are shown by name (see the fixtures below).
CREATE TEMP TABLE err_ids (id bigint PRIMARY KEY, name text NOT NULL);
CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    before text := pg_temp.bus_state();
    result text;
    detail text;
    r record;
BEGIN
    BEGIN
        EXECUTE sql;
        result := 'ok';
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL;
        result := SQLSTATE || ': ' || SQLERRM || coalesce(' (' || nullif(detail, '') || ')', '');
    END;
    IF pg_temp.bus_state() IS DISTINCT FROM before THEN
        result := result || ' [bus changed]';
    END IF;
    FOR r IN SELECT id, name FROM err_ids LOOP
        result := replace(result, 'delivery ' || r.id || ' ', 'delivery <' || r.name || '> ');
    END LOOP;
    RETURN result;
END
$$;

-- Fixtures: a pull handler routed 'err.#' with pending deliveries (one of them
-- leased), an empty pull handler, a notify and an http handler, one dead letter.
SELECT relay_create_handler('err_pull', 'pull', NULL, '{"max_attempts": 1}') > 0 AS created;
SELECT relay_create_handler('err_empty', 'pull') > 0 AS created;
SELECT relay_create_handler('err_notify', 'notify', 'err_channel') > 0 AS created;
SELECT relay_create_handler('err_http', 'http', 'https://example.com/hook',
                            '{"secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}') > 0 AS created;
SELECT relay_route('err.#', 'err_pull');
SELECT relay_publish('err.a', '{"n": 1}', 'err-k1') IS NOT NULL AS published;
SELECT relay_publish('err.a', '{"n": 2}', 'err-k1') IS NOT NULL AS published;
SELECT relay_publish('err.a', '{"n": 3}', 'err-k2') IS NOT NULL AS published;
SELECT relay_publish('err.a', '{"n": 4}', 'err-k3') IS NOT NULL AS published;
SELECT (payload->>'n')::int AS claimed FROM relay_claim('err_pull', 3) ORDER BY 1;
SELECT relay_nack(id, 'fatal') AS outcome FROM relay.deliveries WHERE payload = '{"n": 4}';
SELECT id AS leased_id FROM relay.deliveries WHERE payload = '{"n": 1}' \gset
SELECT id AS other_id FROM relay.deliveries WHERE payload = '{"n": 2}' \gset
SELECT id AS dead_id FROM relay.dead_letters WHERE handler = 'err_pull' \gset
SELECT id AS acked_id FROM relay.deliveries WHERE payload = '{"n": 3}' \gset
SELECT relay_ack(ARRAY[:acked_id]) AS acked;
INSERT INTO err_ids VALUES (:leased_id, 'leased_id'), (:other_id, 'other_id'),
                           (:dead_id, 'dead_id'), (:acked_id, 'acked_id');
SELECT count(*) AS deliveries FROM relay.deliveries \gset
SELECT :deliveries AS deliveries, (SELECT count(*) FROM relay.dead_letters) AS dead_letters;

--
-- relay_publish
--
BEGIN;
SAVEPOINT sp;
SELECT label, pg_temp.try(sql) AS result FROM (VALUES
    ('topic NULL',            $$SELECT relay_publish(NULL, '{}')$$),
    ('topic empty',           $$SELECT relay_publish('', '{}')$$),
    ('topic 256 bytes',       $$SELECT relay_publish(repeat('a', 256), '{}')$$),
    ('topic 255 bytes',       $$SELECT relay_publish(repeat('a', 255), '{}')$$),
    ('topic empty segment',   $$SELECT relay_publish('err..a', '{}')$$),
    ('topic leading dot',     $$SELECT relay_publish('.err.a', '{}')$$),
    ('topic trailing dot',    $$SELECT relay_publish('err.a.', '{}')$$),
    ('topic with a space',    $$SELECT relay_publish('err.a b', '{}')$$),
    ('topic with *',          $$SELECT relay_publish('err.*', '{}')$$),
    ('topic with #',          $$SELECT relay_publish('err.#', '{}')$$),
    ('topic with /',          $$SELECT relay_publish('err/a', '{}')$$),
    ('topic not ASCII',       $$SELECT relay_publish('err.é', '{}')$$),
    ('payload NULL',          $$SELECT relay_publish('err.a', NULL)$$),
    ('payload invalid JSON',  $$SELECT relay_publish('err.a', '{"a": }')$$),
    ('payload invalid JSON 2', $$SELECT relay_publish('err.a', 'not json')$$),
    ('key empty',             $$SELECT relay_publish('err.a', '{}', '')$$),
    ('headers an array',      $$SELECT relay_publish('err.a', '{}', 'err-k9', '[]')$$),
    ('headers a string',      $$SELECT relay_publish('err.a', '{}', NULL, '"h"')$$),
    ('headers a number',      $$SELECT relay_publish('err.a', '{}', NULL, '1')$$),
    ('headers JSON null',     $$SELECT relay_publish('err.a', '{}', NULL, 'null')$$),
    ('headers invalid JSON',  $$SELECT relay_publish('err.a', '{}', NULL, '{x}')$$),
    ('priority -1',           $$SELECT relay_publish('err.a', '{}', priority => -1)$$),
    ('priority 4',            $$SELECT relay_publish('err.a', '{}', priority => 4)$$),
    ('priority NULL',         $$SELECT relay_publish('err.a', '{}', priority => NULL)$$),
    ('not_before infinity',   $$SELECT relay_publish('err.a', '{}', not_before => 'infinity')$$)
) AS t(label, sql);
-- Size limits (settable per session by a superuser); checked before routing.
SET relaybus.max_payload_bytes = 32;
SET relaybus.max_key_bytes = 4;
SELECT label, pg_temp.try(sql) AS result FROM (VALUES
    ('payload over the limit', $$SELECT relay_publish('err.a', '{"a": "0123456789abcdef0123456789"}')$$),
    ('payload under the limit (unrouted topic)', $$SELECT relay_publish('errx.unrouted', '{"a": 1}')$$),
    ('key 5 bytes',           $$SELECT relay_publish('err.a', '{}', 'abcde')$$),
    ('key 3 chars, 6 bytes',  $$SELECT relay_publish('err.a', '{}', 'ééé')$$),
    ('key 4 bytes (unrouted topic)', $$SELECT relay_publish('errx.unrouted', '{}', 'abcd')$$)
) AS t(label, sql);
RESET relaybus.max_payload_bytes;
RESET relaybus.max_key_bytes;
ROLLBACK TO SAVEPOINT sp;
-- The transaction still works; the failed calls wrote nothing.
SELECT relay_publish('err.a', '{"n": 5}', 'err-k4') IS NOT NULL AS still_works;
SELECT count(*) - :deliveries AS new_deliveries FROM relay.deliveries;
ROLLBACK;

--
-- relay_publish_batch
--
BEGIN;
SAVEPOINT sp;
SELECT label, pg_temp.try(sql) AS result FROM (VALUES
    ('topic NULL',            $$SELECT relay_publish_batch(NULL, ARRAY['{}']::jsonb[])$$),
    ('topic invalid',         $$SELECT relay_publish_batch('err..a', ARRAY['{}']::jsonb[])$$),
    ('payloads NULL',         $$SELECT relay_publish_batch('err.a', NULL)$$),
    ('payloads[1] NULL',      $$SELECT relay_publish_batch('err.a', ARRAY[NULL]::jsonb[])$$),
    ('payloads[3] NULL',      $$SELECT relay_publish_batch('err.a', ARRAY['{}', '{}', NULL]::jsonb[])$$),
    ('invalid JSON element',  $$SELECT relay_publish_batch('err.a', ARRAY['{}', '{']::jsonb[])$$),
    ('fewer keys',            $$SELECT relay_publish_batch('err.a', ARRAY['{}', '{}']::jsonb[], ARRAY['err-k1'])$$),
    ('more keys',             $$SELECT relay_publish_batch('err.a', ARRAY['{}']::jsonb[], ARRAY['err-k1', 'err-k2'])$$),
    ('keys but no payloads',  $$SELECT relay_publish_batch('err.a', '{}'::jsonb[], ARRAY['err-k1'])$$),
    ('2-D payloads',          $$SELECT relay_publish_batch('err.a', ARRAY[['{}', '{}'], ['{}', '{}']]::jsonb[])$$),
    ('2-D keys',              $$SELECT relay_publish_batch('err.a', ARRAY['{}', '{}', '{}', '{}']::jsonb[], ARRAY[['a', 'b'], ['c', 'd']])$$),
    ('empty key',             $$SELECT relay_publish_batch('err.a', ARRAY['{}', '{}']::jsonb[], ARRAY['err-k1', ''])$$),
    ('headers not an object', $$SELECT relay_publish_batch('err.a', ARRAY['{}']::jsonb[], headers => '[1]')$$),
    ('priority 4',            $$SELECT relay_publish_batch('err.a', ARRAY['{}']::jsonb[], priority => 4)$$),
    ('priority NULL',         $$SELECT relay_publish_batch('err.a', ARRAY['{}']::jsonb[], priority => NULL)$$),
    ('10001 events',          $$SELECT relay_publish_batch('err.a', array_fill('{}'::jsonb, ARRAY[10001]))$$),
    ('10000 events (unrouted topic)', $$SELECT relay_publish_batch('errx.unrouted', array_fill('{}'::jsonb, ARRAY[10000]))$$)
) AS t(label, sql);
SET relaybus.max_payload_bytes = 32;
SET relaybus.max_key_bytes = 4;
SELECT label, pg_temp.try(sql) AS result FROM (VALUES
    ('payloads[2] too large', $$SELECT relay_publish_batch('err.a', ARRAY['{}', '{"a": "0123456789abcdef0123456789"}']::jsonb[])$$),
    ('keys[2] too long',      $$SELECT relay_publish_batch('err.a', ARRAY['{}', '{}']::jsonb[], ARRAY['abcd', 'abcde'])$$)
) AS t(label, sql);
RESET relaybus.max_payload_bytes;
RESET relaybus.max_key_bytes;
ROLLBACK TO SAVEPOINT sp;
SELECT cardinality(relay_publish_batch('err.a', ARRAY['{"n": 6}', '{"n": 7}']::jsonb[], ARRAY['err-k4', NULL])) AS still_works;
SELECT count(*) - :deliveries AS new_deliveries FROM relay.deliveries;
ROLLBACK;

--
-- relay_create_handler
--
BEGIN;
SAVEPOINT sp;
SELECT label, pg_temp.try(sql) AS result FROM (VALUES
    ('name NULL',             $$SELECT relay_create_handler(NULL, 'pull')$$),
    ('kind NULL',             $$SELECT relay_create_handler('err_x', NULL)$$),
    ('name empty',            $$SELECT relay_create_handler('', 'pull')$$),
    ('name upper case',       $$SELECT relay_create_handler('Err_x', 'pull')$$),
    ('name with a space',     $$SELECT relay_create_handler('err x', 'pull')$$),
    ('name with /',           $$SELECT relay_create_handler('err/x', 'pull')$$),
    ('name 64 bytes',         $$SELECT relay_create_handler(repeat('e', 64), 'pull')$$),
    ('name exists',           $$SELECT relay_create_handler('err_pull', 'pull')$$),
    ('name exists, other kind', $$SELECT relay_create_handler('err_pull', 'notify', 'ch')$$),
    ('kind unknown',          $$SELECT relay_create_handler('err_x', 'amqp')$$),
    ('kind upper case',       $$SELECT relay_create_handler('err_x', 'PULL')$$),
    ('pull with a target',    $$SELECT relay_create_handler('err_x', 'pull', 'err_channel')$$),
    ('notify, no target',     $$SELECT relay_create_handler('err_x', 'notify')$$),
    ('notify, empty channel', $$SELECT relay_create_handler('err_x', 'notify', '')$$),
    ('notify, channel 1abc',  $$SELECT relay_create_handler('err_x', 'notify', '1abc')$$),
    ('notify, channel a-b',   $$SELECT relay_create_handler('err_x', 'notify', 'a-b')$$),
    ('notify, channel a.b',   $$SELECT relay_create_handler('err_x', 'notify', 'a.b')$$),
    ('notify, channel 64 bytes', $$SELECT relay_create_handler('err_x', 'notify', repeat('c', 64))$$),
    ('http, no target',       $$SELECT relay_create_handler('err_x', 'http')$$),
    ('http, no scheme',       $$SELECT relay_create_handler('err_x', 'http', 'example.com/hook')$$),
    ('http, ftp://',          $$SELECT relay_create_handler('err_x', 'http', 'ftp://example.com/hook')$$),
    ('http, no host',         $$SELECT relay_create_handler('err_x', 'http', 'http://')$$),
    ('http, no host, path',   $$SELECT relay_create_handler('err_x', 'http', 'http:///hook')$$),
    ('http, no host, port',   $$SELECT relay_create_handler('err_x', 'http', 'http://:80/hook')$$),
    ('http, user:password@',  $$SELECT relay_create_handler('err_x', 'http', 'https://user:secret@example.com/hook')$$),
    ('http, user@',           $$SELECT relay_create_handler('err_x', 'http', 'https://user@example.com/hook')$$),
    ('http, port 0',          $$SELECT relay_create_handler('err_x', 'http', 'http://example.com:0/')$$),
    ('http, port 65536',      $$SELECT relay_create_handler('err_x', 'http', 'http://example.com:65536/')$$),
    ('http, port not a number', $$SELECT relay_create_handler('err_x', 'http', 'http://example.com:http/')$$),
    ('http, space',           $$SELECT relay_create_handler('err_x', 'http', 'http://example.com/a b')$$),
    ('http, fragment',        $$SELECT relay_create_handler('err_x', 'http', 'http://example.com/#top')$$),
    ('http, bad IPv6',        $$SELECT relay_create_handler('err_x', 'http', 'http://[::1/')$$)
) AS t(label, sql);
-- Options: unknown, wrong type, out of range, not allowed for the kind.
SELECT label, pg_temp.try(sql) AS result FROM (VALUES
    ('options an array',      $$SELECT relay_create_handler('err_x', 'pull', NULL, '[]')$$),
    ('options a string',      $$SELECT relay_create_handler('err_x', 'pull', NULL, '"lease"')$$),
    ('unknown option',        $$SELECT relay_create_handler('err_x', 'pull', NULL, '{"retries": 3}')$$),
    ('max_attempts a string', $$SELECT relay_create_handler('err_x', 'pull', NULL, '{"max_attempts": "3"}')$$),
    ('max_attempts 0',        $$SELECT relay_create_handler('err_x', 'pull', NULL, '{"max_attempts": 0}')$$),
    ('max_attempts 1001',     $$SELECT relay_create_handler('err_x', 'pull', NULL, '{"max_attempts": 1001}')$$),
    ('max_attempts 1.5',      $$SELECT relay_create_handler('err_x', 'pull', NULL, '{"max_attempts": 1.5}')$$),
    ('max_attempts true',     $$SELECT relay_create_handler('err_x', 'pull', NULL, '{"max_attempts": true}')$$),
    ('backoff_base 0s',       $$SELECT relay_create_handler('err_x', 'pull', NULL, '{"backoff_base": "0s"}')$$),
    ('backoff_base 2d',       $$SELECT relay_create_handler('err_x', 'pull', NULL, '{"backoff_base": "2d"}')$$),
    ('backoff_base a number', $$SELECT relay_create_handler('err_x', 'pull', NULL, '{"backoff_base": 5}')$$),
    ('backoff_base negative', $$SELECT relay_create_handler('err_x', 'pull', NULL, '{"backoff_base": "-1s"}')$$),
    ('backoff_base no unit',  $$SELECT relay_create_handler('err_x', 'pull', NULL, '{"backoff_base": "soon"}')$$),
    ('backoff_max 8d',        $$SELECT relay_create_handler('err_x', 'pull', NULL, '{"backoff_max": "8d"}')$$),
    ('backoff_max < base',    $$SELECT relay_create_handler('err_x', 'pull', NULL, '{"backoff_base": "1h", "backoff_max": "1min"}')$$),
    ('backoff_max < default base', $$SELECT relay_create_handler('err_x', 'pull', NULL, '{"backoff_max": "500ms"}')$$),
    ('lease 500ms',           $$SELECT relay_create_handler('err_x', 'pull', NULL, '{"lease": "500ms"}')$$),
    ('lease 2d',              $$SELECT relay_create_handler('err_x', 'pull', NULL, '{"lease": "2d"}')$$),
    ('timeout on pull',       $$SELECT relay_create_handler('err_x', 'pull', NULL, '{"timeout": "5s"}')$$),
    ('timeout on notify',     $$SELECT relay_create_handler('err_x', 'notify', 'ch', '{"timeout": "5s"}')$$),
    ('timeout 2h',            $$SELECT relay_create_handler('err_x', 'http', 'http://h', '{"timeout": "2h"}')$$),
    ('timeout 0ms',           $$SELECT relay_create_handler('err_x', 'http', 'http://h', '{"timeout": "0ms"}')$$),
    ('concurrency on pull',   $$SELECT relay_create_handler('err_x', 'pull', NULL, '{"concurrency": 4}')$$),
    ('concurrency 0',         $$SELECT relay_create_handler('err_x', 'http', 'http://h', '{"concurrency": 0}')$$),
    ('concurrency 1025',      $$SELECT relay_create_handler('err_x', 'notify', 'ch', '{"concurrency": 1025}')$$),
    ('ack on http',           $$SELECT relay_create_handler('err_x', 'http', 'http://h', '{"ack": true}')$$),
    ('ack on pull',           $$SELECT relay_create_handler('err_x', 'pull', NULL, '{"ack": true}')$$),
    ('ack a string',          $$SELECT relay_create_handler('err_x', 'notify', 'ch', '{"ack": "yes"}')$$),
    ('secret on pull',        $$SELECT relay_create_handler('err_x', 'pull', NULL, '{"secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}')$$),
    ('secret on notify',      $$SELECT relay_create_handler('err_x', 'notify', 'ch', '{"secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}')$$),
    ('secret without whsec_', $$SELECT relay_create_handler('err_x', 'http', 'http://h', '{"secret": "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}')$$),
    ('secret not base64',     $$SELECT relay_create_handler('err_x', 'http', 'http://h', '{"secret": "whsec_not*base64!"}')$$),
    ('secret empty key',      $$SELECT relay_create_handler('err_x', 'http', 'http://h', '{"secret": "whsec_"}')$$),
    ('secret of 4 bytes',     $$SELECT relay_create_handler('err_x', 'http', 'http://h', '{"secret": "whsec_dGVzdA=="}')$$),
    ('secret of 23 bytes',    $$SELECT relay_create_handler('err_x', 'http', 'http://h', '{"secret": "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY="}')$$),
    ('secret array, short 2nd', $$SELECT relay_create_handler('err_x', 'http', 'http://h', '{"secret": ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_dGVzdA=="]}')$$),
    ('inline_payload on http', $$SELECT relay_create_handler('err_x', 'http', 'http://h', '{"inline_payload": false}')$$),
    ('inline_payload on pull', $$SELECT relay_create_handler('err_x', 'pull', NULL, '{"inline_payload": false}')$$),
    ('inline_payload a string', $$SELECT relay_create_handler('err_x', 'notify', 'ch', '{"inline_payload": "no"}')$$),
    ('secret a number',       $$SELECT relay_create_handler('err_x', 'http', 'http://h', '{"secret": 42}')$$),
    ('secret empty array',    $$SELECT relay_create_handler('err_x', 'http', 'http://h', '{"secret": []}')$$),
    ('secret array, bad 2nd', $$SELECT relay_create_handler('err_x', 'http', 'http://h', '{"secret": ["whsec_dGVzdA==", "whsec_???"]}')$$),
    ('secret array of 11',    $$SELECT relay_create_handler('err_x', 'http', 'http://h', jsonb_build_object('secret', array_fill('whsec_dGVzdA=='::text, ARRAY[11])))$$),
    ('headers on notify',     $$SELECT relay_create_handler('err_x', 'notify', 'ch', '{"headers": {"X-A": "1"}}')$$),
    ('headers an array',      $$SELECT relay_create_handler('err_x', 'http', 'http://h', '{"headers": ["X-A"]}')$$),
    ('headers, number value', $$SELECT relay_create_handler('err_x', 'http', 'http://h', '{"headers": {"X-A": 1}}')$$),
    ('headers, bad name',     $$SELECT relay_create_handler('err_x', 'http', 'http://h', '{"headers": {"X A": "1"}}')$$),
    ('headers, reserved name', $$SELECT relay_create_handler('err_x', 'http', 'http://h', '{"headers": {"content-type": "text/plain"}}')$$),
    ('headers, twice',        $$SELECT relay_create_handler('err_x', 'http', 'http://h', '{"headers": {"X-A": "1", "x-a": "2"}}')$$),
    ('headers, CR LF in value', $$SELECT relay_create_handler('err_x', 'http', 'http://h', '{"headers": {"X-A": "1\r\nX-B: 2"}}')$$)
) AS t(label, sql);
ROLLBACK TO SAVEPOINT sp;
SELECT relay_create_handler('err_new', 'pull') > 0 AS still_works;
SELECT name FROM relay.handlers WHERE name LIKE 'err\_%' ORDER BY name;
ROLLBACK;

--
-- relay_alter_handler
--
BEGIN;
SAVEPOINT sp;
SELECT label, pg_temp.try(sql) AS result FROM (VALUES
    ('name NULL',             $$SELECT relay_alter_handler(NULL, options => '{"lease": "5s"}')$$),
    ('unknown handler',       $$SELECT relay_alter_handler('err_nope', options => '{"lease": "5s"}')$$),
    ('options an array',      $$SELECT relay_alter_handler('err_pull', options => '[]')$$),
    ('unknown option',        $$SELECT relay_alter_handler('err_pull', options => '{"retries": 3}')$$),
    ('max_attempts 0',        $$SELECT relay_alter_handler('err_pull', options => '{"max_attempts": 0}')$$),
    ('lease wrong type',      $$SELECT relay_alter_handler('err_pull', options => '{"lease": 30}')$$),
    ('ack on http',           $$SELECT relay_alter_handler('err_http', options => '{"ack": true}')$$),
    ('secret on pull',        $$SELECT relay_alter_handler('err_pull', options => '{"secret": "whsec_dGVzdA=="}')$$),
    ('bad whsec_ secret',     $$SELECT relay_alter_handler('err_http', options => '{"secret": "whsec_%%%"}')$$),
    ('secret of 4 bytes',     $$SELECT relay_alter_handler('err_http', options => '{"secret": "whsec_dGVzdA=="}')$$),
    ('merged: max < base',    $$SELECT relay_alter_handler('err_pull', options => '{"backoff_base": "20min"}')$$),
    ('pull with a target',    $$SELECT relay_alter_handler('err_pull', 'err_channel')$$),
    ('notify, bad channel',   $$SELECT relay_alter_handler('err_notify', 'bad-channel')$$),
    ('http, ftp://',          $$SELECT relay_alter_handler('err_http', 'ftp://example.com/')$$),
    ('http, userinfo',        $$SELECT relay_alter_handler('err_http', 'https://u:p@example.com/')$$)
) AS t(label, sql);
ROLLBACK TO SAVEPOINT sp;
SELECT relay_alter_handler('err_pull', options => '{"lease": "5s"}');
SELECT name, options FROM relay.handlers WHERE name = 'err_pull';
ROLLBACK;

--
-- relay_drop_handler, relay_route, relay_unroute, relay_replay
--
BEGIN;
SAVEPOINT sp;
SELECT label, pg_temp.try(sql) AS result FROM (VALUES
    ('drop: name NULL',       $$SELECT relay_drop_handler(NULL)$$),
    ('drop: unknown handler', $$SELECT relay_drop_handler('err_nope')$$),
    ('drop: unknown, force',  $$SELECT relay_drop_handler('err_nope', true)$$),
    ('drop: pending deliveries', $$SELECT relay_drop_handler('err_pull')$$),
    ('drop: pending, force false', $$SELECT relay_drop_handler('err_pull', false)$$),
    ('route: topic NULL',     $$SELECT relay_route(NULL, 'err_pull')$$),
    ('route: handler NULL',   $$SELECT relay_route('err.x', NULL)$$),
    ('route: unknown handler', $$SELECT relay_route('err.x', 'err_nope')$$),
    ('route: pattern empty',  $$SELECT relay_route('', 'err_pull')$$),
    ('route: empty segment',  $$SELECT relay_route('err..x', 'err_pull')$$),
    ('route: trailing dot',   $$SELECT relay_route('err.', 'err_pull')$$),
    ('route: partial *',      $$SELECT relay_route('err.x*', 'err_pull')$$),
    ('route: partial #',      $$SELECT relay_route('err.#x', 'err_pull')$$),
    ('route: space',          $$SELECT relay_route('err x', 'err_pull')$$),
    ('route: 256 bytes',      $$SELECT relay_route(repeat('a', 256), 'err_pull')$$),
    ('route: wire name with a space', $$SELECT relay_route('err.x', 'err_pull', 'a b')$$),
    ('route: wire name with *', $$SELECT relay_route('err.x', 'err_pull', 'err.*')$$),
    ('route: wire name empty', $$SELECT relay_route('err.x', 'err_pull', '')$$),
    ('route: wire name ..',   $$SELECT relay_route('err.x', 'err_pull', 'a..b')$$),
    ('unroute: topic NULL',   $$SELECT relay_unroute(NULL, 'err_pull')$$),
    ('unroute: handler NULL', $$SELECT relay_unroute('err.#', NULL)$$),
    ('unroute: unknown handler', $$SELECT relay_unroute('err.#', 'err_nope')$$),
    ('unroute: no such route', $$SELECT relay_unroute('err.nope', 'err_pull')$$),
    ('replay: unknown handler', $$SELECT relay_replay('err_nope')$$),
    ('replay: unknown handler and ids', $$SELECT relay_replay('err_nope', ARRAY[1::bigint])$$),
    ('replay: ids of no dead letter', $$SELECT relay_replay('err_pull', ARRAY[-1::bigint])$$)
) AS t(label, sql);
ROLLBACK TO SAVEPOINT sp;
SELECT relay_route('err.x', 'err_empty', 'err.wire');
SELECT pattern, wire_name FROM relay.routes WHERE wire_name = 'err.wire';
ROLLBACK;

--
-- relay_claim
--
BEGIN;
SAVEPOINT sp;
SELECT label, pg_temp.try(sql) AS result FROM (VALUES
    ('handler NULL',          $$SELECT * FROM relay_claim(NULL)$$),
    ('unknown handler',       $$SELECT * FROM relay_claim('err_nope')$$),
    ('notify handler',        $$SELECT * FROM relay_claim('err_notify')$$),
    ('http handler',          $$SELECT * FROM relay_claim('err_http')$$),
    ('max 0',                 $$SELECT * FROM relay_claim('err_pull', 0)$$),
    ('max -1',                $$SELECT * FROM relay_claim('err_pull', -1)$$),
    ('max 10001',             $$SELECT * FROM relay_claim('err_pull', 10001)$$),
    ('max 2147483647',        $$SELECT * FROM relay_claim('err_pull', 2147483647)$$),
    ('max NULL',              $$SELECT * FROM relay_claim('err_pull', NULL)$$),
    ('per_key 0',             $$SELECT * FROM relay_claim('err_pull', per_key => 0)$$),
    ('per_key -5',            $$SELECT * FROM relay_claim('err_pull', per_key => -5)$$),
    ('per_key 10001',         $$SELECT * FROM relay_claim('err_pull', per_key => 10001)$$),
    ('lease 0s',              $$SELECT * FROM relay_claim('err_pull', lease => '0s')$$),
    ('lease 999ms',           $$SELECT * FROM relay_claim('err_pull', lease => '999 ms')$$),
    ('lease -1s',             $$SELECT * FROM relay_claim('err_pull', lease => '-1s')$$),
    ('lease 1 day 1 second',  $$SELECT * FROM relay_claim('err_pull', lease => '1 day 1 second')$$),
    ('lease 1 mon',           $$SELECT * FROM relay_claim('err_pull', lease => '1 mon')$$),
    -- The limits themselves are accepted (a handler without deliveries: nothing changes).
    ('max 10000, per_key 10000, lease 1s', $$SELECT * FROM relay_claim('err_empty', 10000, '1s', 10000)$$),
    ('max 1, per_key 1, lease 1 day', $$SELECT * FROM relay_claim('err_empty', 1, '1 day', 1)$$),
    ('per_key NULL: the default', $$SELECT * FROM relay_claim('err_empty', per_key => NULL)$$)
) AS t(label, sql);
ROLLBACK TO SAVEPOINT sp;
SELECT (payload->>'n')::int AS n FROM relay_claim('err_pull', lease => '1s');
ROLLBACK;

--
-- relay_ack, relay_nack
--
-- :leased_id and :other_id are pending ({"n": 1} leased by this session, {"n": 2} not),
-- :acked_id was acked, :dead_id is a dead letter, -1 never existed.
BEGIN;
SAVEPOINT sp;
SELECT label, pg_temp.try(sql) AS result FROM (VALUES
    ('ack NULL',              $$SELECT relay_ack(NULL)$$),
    ('ack {NULL}',            $$SELECT relay_ack(ARRAY[NULL]::bigint[])$$),
    ('ack {id, NULL}',        format($$SELECT relay_ack(ARRAY[%s, NULL])$$, :leased_id)),
    ('ack unknown id',        $$SELECT relay_ack(ARRAY[-1::bigint])$$),
    ('ack known + unknown',   format($$SELECT relay_ack(ARRAY[%s, %s, -1])$$, :leased_id, :other_id)),
    ('ack unknown + known',   format($$SELECT relay_ack(ARRAY[-1, %s])$$, :leased_id)),
    ('ack of an acked id',    format($$SELECT relay_ack(ARRAY[%s])$$, :acked_id)),
    ('ack of a dead letter',  format($$SELECT relay_ack(ARRAY[%s, %s])$$, :dead_id, :other_id)),
    ('nack NULL',             $$SELECT relay_nack(NULL)$$),
    ('nack unknown id',       $$SELECT relay_nack(-1, 'x')$$),
    ('nack a dead letter',    format($$SELECT relay_nack(%s, 'x')$$, :dead_id)),
    ('nack retry_in -1s',     format($$SELECT relay_nack(%s, 'x', '-1s')$$, :leased_id)),
    ('nack retry_in -1 day',  format($$SELECT relay_nack(%s, 'x', '-1 day')$$, :leased_id)),
    ('nack retry_in 1 day -25 hours', format($$SELECT relay_nack(%s, 'x', '1 day -25 hours')$$, :leased_id)),
    ('nack retry_in 400 days', format($$SELECT relay_nack(%s, 'x', '400 days')$$, :leased_id)),
    ('ack, no lease',         format($$SELECT relay_ack(ARRAY[%s])$$, :other_id)),
    ('ack, wrong lease',      format($$SELECT relay_ack(ARRAY[%s], ARRAY['00000000-0000-0000-0000-000000000001'::uuid])$$, :leased_id)),
    ('ack, leases too short', format($$SELECT relay_ack(ARRAY[%s, %s], ARRAY[NULL]::uuid[])$$, :leased_id, :other_id)),
    ('ack unknown, wrong lease', $$SELECT relay_ack(ARRAY[-1::bigint], ARRAY[gen_random_uuid()])$$),
    ('nack, no lease',        format($$SELECT relay_nack(%s, 'x')$$, :other_id)),
    ('nack, wrong lease',     format($$SELECT relay_nack(%s, 'x', NULL, '00000000-0000-0000-0000-000000000001')$$, :leased_id)),
    ('extend NULL',           $$SELECT relay_extend(NULL, NULL)$$),
    ('extend unknown id',     $$SELECT relay_extend(-1, NULL)$$),
    ('extend, no lease',      format($$SELECT relay_extend(%s, NULL)$$, :other_id)),
    ('extend, wrong lease',   format($$SELECT relay_extend(%s, '00000000-0000-0000-0000-000000000001')$$, :leased_id)),
    ('extend_by 0.5s',        format($$SELECT relay_extend(%s, NULL, '0.5s')$$, :leased_id)),
    ('extend_by 1 day 1s',    format($$SELECT relay_extend(%s, NULL, '1 day 1 second')$$, :leased_id))
) AS t(label, sql);
ROLLBACK TO SAVEPOINT sp;
-- Nothing was acked: both still pending; and the transaction still works.
SELECT (payload->>'n')::int AS n FROM relay.deliveries WHERE id IN (:leased_id, :other_id) ORDER BY n;
SELECT relay_ack(ARRAY[:leased_id]) AS acked;
ROLLBACK;

--
-- The same errors raised for real: the statement fails, the transaction is
-- aborted until ROLLBACK TO SAVEPOINT, and then works again with nothing written.
--
\set VERBOSITY sqlstate
BEGIN;
SAVEPOINT a;
SELECT relay_publish('err.a', '{}', priority => 9);
SELECT 1 AS in_aborted_transaction;
ROLLBACK TO SAVEPOINT a;
SELECT count(*) - :deliveries AS new_deliveries FROM relay.deliveries;
SELECT relay_publish_batch('err.a', ARRAY['{}', NULL]::jsonb[]);
ROLLBACK TO SAVEPOINT a;
SELECT relay_ack(ARRAY[:leased_id, :other_id, -1]);
ROLLBACK TO SAVEPOINT a;
SELECT count(*) AS still_pending FROM relay.deliveries WHERE id IN (:leased_id, :other_id);
SELECT relay_nack(-1);
ROLLBACK TO SAVEPOINT a;
SELECT * FROM relay_claim('err_notify');
ROLLBACK TO SAVEPOINT a;
SELECT * FROM relay_claim('err_pull', 0);
ROLLBACK TO SAVEPOINT a;
SELECT relay_create_handler('err_pull', 'pull');
ROLLBACK TO SAVEPOINT a;
SELECT relay_create_handler('err_x', 'http', 'ftp://example.com/');
ROLLBACK TO SAVEPOINT a;
SELECT relay_alter_handler('err_nope');
ROLLBACK TO SAVEPOINT a;
SELECT relay_route('err.*x', 'err_pull');
ROLLBACK TO SAVEPOINT a;
SELECT relay_drop_handler('err_pull');
ROLLBACK TO SAVEPOINT a;
SELECT relay_replay('err_nope');
ROLLBACK TO SAVEPOINT a;
SELECT count(*) - :deliveries AS new_deliveries FROM relay.deliveries;
SELECT relay_ack(ARRAY[:leased_id]) AS acked;
COMMIT;
\set VERBOSITY default
SELECT count(*) - :deliveries AS new_deliveries FROM relay.deliveries;

-- With force, a handler with pending deliveries is dropped; its dead letters stay.
SELECT relay_drop_handler('err_pull', force => true);
SELECT count(*) AS dead_letters_kept FROM relay.dead_letters WHERE handler = 'err_pull';

-- Clean up.
SELECT relay_drop_handler(name, true) FROM relay.handlers WHERE name LIKE 'err\_%' ORDER BY name;
DELETE FROM relay.dead_letters WHERE handler LIKE 'err\_%';
DELETE FROM relay.key_seqs WHERE key LIKE 'err-%';
