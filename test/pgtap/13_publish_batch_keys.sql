-- A batch's key counters: keys seen for the first time (the upsert through
-- SPI) and keys with a counter (bumped directly), many of each in one call.
-- The full harness's preload (10,000 events over 1,000 new keys per call)
-- failed with "key counter returned for a key not in the batch": the upsert's
-- returned key names were read after SPI had freed them.
BEGIN;
SELECT plan(6);

SELECT relay_create_handler('tap_bk', 'pull');
SELECT relay_route('tap.bk.#', 'tap_bk');

-- 10,000 events over 1,000 keys no counter has seen: every key takes the upsert.
SELECT lives_ok($$SELECT relay_publish_batch('tap.bk.x',
                      (SELECT array_agg(jsonb_build_object('i', i) ORDER BY i) FROM generate_series(1, 10000) i),
                      (SELECT array_agg('tap-bk-' || (i % 1000) ORDER BY i) FROM generate_series(1, 10000) i))$$,
                'a batch of 10,000 events over 1,000 new keys');
SELECT is((SELECT count(*) FROM relay.key_seqs WHERE key LIKE 'tap-bk-%'), 1000::bigint, 'one counter per key');
SELECT is((SELECT count(*) FROM (SELECT key FROM relay.deliveries WHERE topic = 'tap.bk.x'
                                  GROUP BY key HAVING array_agg(seq ORDER BY (payload->>'i')::int)
                                                      <> array_agg(seq ORDER BY seq)
                                                  OR min(seq) <> 1 OR max(seq) <> 10) bad),
          0::bigint, 'each key''s seqs are 1..10 in batch order');

-- Half the keys known (bumped directly), half new (the upsert), in one call.
SELECT lives_ok($$SELECT relay_publish_batch('tap.bk.y',
                      (SELECT array_agg(jsonb_build_object('i', i) ORDER BY i) FROM generate_series(1, 4000) i),
                      (SELECT array_agg('tap-bk-' || (500 + i % 1000) ORDER BY i) FROM generate_series(1, 4000) i))$$,
                'a batch over 500 known and 500 new keys');
SELECT is((SELECT count(*) FROM (SELECT key FROM relay.deliveries WHERE topic = 'tap.bk.y'
                                  GROUP BY key HAVING array_agg(seq ORDER BY (payload->>'i')::int)
                                                      <> array_agg(seq ORDER BY seq)
                                                  OR max(seq) - min(seq) <> 3) bad),
          0::bigint, 'each key''s four new seqs are consecutive in batch order');
SELECT is((SELECT count(*) FROM relay.deliveries WHERE topic = 'tap.bk.y'
            AND seq <> CASE WHEN substr(key, 8)::int < 1000 THEN 10 ELSE 0 END
                       + 1 + ((payload->>'i')::int - 1) / 1000),
          0::bigint, 'known keys go on from 10, new ones start at 1');

SELECT * FROM finish();
ROLLBACK;
