-- The settings that bound test waits (relaybus.http_lease_margin,
-- relaybus.dedupe_cleanup_interval): their defaults are the constants they
-- replaced, they change on reload only, within their ranges.
BEGIN;
SELECT plan(6);

SELECT is(current_setting('relaybus.http_lease_margin'), '30s', 'http_lease_margin defaults to 30s');
SELECT is(current_setting('relaybus.dedupe_cleanup_interval'), '10s', 'dedupe_cleanup_interval defaults to 10s');
SELECT is((SELECT format('%s %s..%s %s', context, min_val, max_val, unit) FROM pg_settings
           WHERE name = 'relaybus.http_lease_margin'), 'sighup 1000..3600000 ms', 'http_lease_margin: reload, 1s..1h');
SELECT is((SELECT format('%s %s..%s %s', context, min_val, max_val, unit) FROM pg_settings
           WHERE name = 'relaybus.dedupe_cleanup_interval'), 'sighup 100..3600000 ms',
          'dedupe_cleanup_interval: reload, 100ms..1h');
SELECT throws_ok($$SET relaybus.http_lease_margin = '5s'$$, '55P02', NULL,
                 'http_lease_margin cannot be SET in a session');
SELECT throws_ok($$SET relaybus.dedupe_cleanup_interval = '1s'$$, '55P02', NULL,
                 'dedupe_cleanup_interval cannot be SET in a session');

SELECT * FROM finish();
ROLLBACK;
