-- Settings in the forms PostgreSQL shows them: with the library loaded,
-- current_setting('relaybus.max_key_bytes') reads '512B' and a duration
-- '30s'; the SQL edition reads the same text from the same settings (a
-- database of that edition in a cluster that preloads the library, or an
-- application that copies a value it read) and must take it as the
-- extension does. A unit the setting does not have is refused (22023).
BEGIN;
SELECT plan(7);

SELECT relay_create_handler('tap_units', 'pull');
SELECT relay_route('tap.units.#', 'tap_units');

SET LOCAL relaybus.max_key_bytes = '8B';
SELECT throws_ok($$SELECT relay_publish('tap.units.x', '{}', repeat('k', 9))$$, '22001', NULL,
                 'max_key_bytes ''8B'': a 9-byte key is too long');
SELECT ok(relay_publish('tap.units.x', '{}', repeat('k', 8)) > 0, '... an 8-byte key is published');
SET LOCAL relaybus.max_key_bytes = '1kB';
SELECT ok(relay_publish('tap.units.x', '{}', repeat('k', 1024)) > 0, 'max_key_bytes ''1kB'': a 1024-byte key is published');
SELECT throws_ok($$SELECT relay_publish('tap.units.x', '{}', repeat('k', 1025))$$, '22001', NULL,
                 '... a 1025-byte key is too long');
SET LOCAL relaybus.max_payload_bytes = '64B';
SELECT throws_ok($$SELECT relay_publish('tap.units.x', jsonb_build_object('p', repeat('x', 64)))$$, '54000', NULL,
                 'max_payload_bytes ''64B'': a larger payload is refused');
RESET relaybus.max_payload_bytes;
SET LOCAL relaybus.dedupe_window = '30s';
SELECT ok(relay_publish('tap.units.x', '{}', dedupe_key => 'tap-units-1')
          = relay_publish('tap.units.x', '{}', dedupe_key => 'tap-units-1'), 'dedupe_window ''30s'' is a window');
SELECT throws_ok($$SET LOCAL relaybus.max_key_bytes = '8s'; SELECT relay_publish('tap.units.x', '{}', 'k')$$, '22023', NULL,
                 'max_key_bytes ''8s'' (a duration): refused');

SELECT * FROM finish();
ROLLBACK;
