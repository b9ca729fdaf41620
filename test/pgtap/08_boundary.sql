-- The C++/PostgreSQL boundary: whatever leaves an entry point's C++ code (a
-- relaybus error, std::bad_alloc, another exception, or a PostgreSQL ERROR
-- raised under C++ frames and carried across them) reaches the caller as a
-- clean ERROR with its SQLSTATE, and the session and transaction go on.
-- relaybus.test_fault makes relay._validate_route fail each way.
BEGIN;
SELECT plan(12);

SELECT throws_ok($$SELECT relay_create_handler('Bad', 'pull')$$, '22023', 'invalid handler name "Bad"',
                 'a relaybus error (SqlError) keeps its SQLSTATE and message');
SELECT throws_ok($$SELECT relay_route('a..b', 'nobody')$$, '22023', 'invalid topic pattern "a..b"',
                 'so does the route check');

SET LOCAL relaybus.test_fault = 'bad_alloc';
SELECT throws_ok($$SELECT relay._validate_route('a.b', NULL)$$, '53200', 'out of memory in relaybus',
                 'std::bad_alloc becomes out_of_memory (53200)');
SET LOCAL relaybus.test_fault = 'exception';
SELECT throws_ok($$SELECT relay._validate_route('a.b', NULL)$$, 'XX000', 'relaybus.test_fault = exception',
                 'another std::exception becomes internal_error (XX000) with its message');
SET LOCAL relaybus.test_fault = 'pg_error';
SELECT throws_ok($$SELECT relay._validate_route('a.b', NULL)$$, '22012', 'division by zero',
                 'a PostgreSQL ERROR raised under C++ frames keeps its SQLSTATE and message');

-- Many in a row (each rolled back to its own savepoint): nothing is left behind.
CREATE FUNCTION pg_temp.faults(kind text, n int) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    states text[] := '{}';
    state text;
BEGIN
    PERFORM set_config('relaybus.test_fault', kind, true);
    FOR i IN 1 .. n LOOP
        BEGIN
            PERFORM relay._validate_route('a.b', NULL);
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE;
            IF NOT state = ANY (states) THEN states := states || state; END IF;
        END;
    END LOOP;
    PERFORM set_config('relaybus.test_fault', '', true);
    RETURN array_to_string(states, ',');
END $$;
SELECT is(pg_temp.faults('pg_error', 500), '22012', '500 PostgreSQL errors carried across C++ frames');
SELECT is(pg_temp.faults('bad_alloc', 500), '53200', '500 bad_allocs');
SELECT is(pg_temp.faults('exception', 500), 'XX000', '500 exceptions');

SET LOCAL relaybus.test_fault = '';
SELECT lives_ok($$SELECT relay._validate_route('a.b', 'a.c')$$, 'without a fault the call succeeds');
SELECT lives_ok($$SELECT relay_create_handler('tap_boundary', 'pull')$$, 'the transaction goes on');
SELECT is((SELECT count(*) FROM relay.handlers WHERE name = 'tap_boundary'), 1::bigint,
          'and sees its own work');
SELECT is(current_setting('relaybus.test_fault'), '', 'the fault is off again');

SELECT * FROM finish();
ROLLBACK;
