-- relaybus 0.2.0 -> 0.3.0 (docs/operations.md, "Changing the SQL").

-- ================================================================================
-- Send times and gaps (issue 26, item 3): relay.handler_stats and
-- relay.handler_metrics show how long attempts take to go out and come back
-- (an HTTP exchange, a Kafka produce to its acknowledgement) and the kafka
-- messages acknowledged after a gap of their key (docs/operations.md).
-- ================================================================================

CREATE FUNCTION relay._handler_sends(OUT handler_id integer, OUT sends bigint,
                                     OUT send_p50_ms float8, OUT send_p99_ms float8,
                                     OUT send_sum_seconds float8, OUT delivered_after_gap bigint)
RETURNS SETOF record AS 'MODULE_PATHNAME', 'relay_handler_sends' LANGUAGE C;
REVOKE EXECUTE ON FUNCTION relay._handler_sends() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION relay._handler_sends() TO relay_monitor, relay_consumer;

-- ================================================================================
-- Shared limits (issue 27, item 4): handlers' rate and max_concurrency hold
-- across a database's dispatchers; relay.handler_stats and
-- relay.handler_metrics show the deliveries that waited for a permit and
-- whether a handler is held back now (docs/operations.md).
-- ================================================================================

CREATE FUNCTION relay._handler_limits(OUT handler_id integer, OUT held_back bigint, OUT limited boolean)
RETURNS SETOF record AS 'MODULE_PATHNAME', 'relay_handler_limits' LANGUAGE C;
REVOKE EXECUTE ON FUNCTION relay._handler_limits() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION relay._handler_limits() TO relay_monitor, relay_consumer;

-- Both sections' columns join the views at the end, in this order:
-- CREATE OR REPLACE VIEW keeps the views' privileges and any view built on them.
CREATE OR REPLACE VIEW relay.handler_stats AS
SELECT h.name AS handler,
       h.kind,
       coalesce(d.pending, 0)  AS pending,
       coalesce(d.ready, 0)    AS ready,
       coalesce(d.delayed, 0)  AS delayed,
       coalesce(l.in_flight, 0) AS in_flight,
       coalesce(d.retrying, 0) AS retrying,
       coalesce(x.dead, 0)     AS dead,
       d.oldest_pending_age,
       coalesce(c.delivered, 0) AS delivered,
       coalesce(c.retried, 0)   AS retried,
       c.latency_p50_ms,
       c.latency_p99_ms,
       c.http_2xx, c.http_3xx, c.http_4xx, c.http_5xx, c.http_errors,
       CASE WHEN c.breaker_until > now() THEN c.breaker_until END AS breaker_until,
       h.paused,
       current_database() AS database,
       s.send_p50_ms,
       s.send_p99_ms,
       coalesce(s.delivered_after_gap, 0) AS delivered_after_gap,
       coalesce(lim.held_back, 0) AS held_back,
       coalesce(lim.limited, false) AS limited
  FROM relay.handlers h
  LEFT JOIN relay._handler_counters() c ON c.handler_id = h.id
  LEFT JOIN relay._handler_sends() s ON s.handler_id = h.id
  LEFT JOIN relay._handler_limits() lim ON lim.handler_id = h.id
  LEFT JOIN LATERAL (
        SELECT count(*) AS pending,
               count(*) FILTER (WHERE dd.not_before <= now()) AS ready,
               count(*) FILTER (WHERE dd.not_before > now()) AS delayed,
               count(*) FILTER (WHERE dd.attempt > 0) AS retrying,
               now() - min(dd.published_at) AS oldest_pending_age
          FROM relay.deliveries dd WHERE dd.handler_id = h.id) d ON true
  LEFT JOIN LATERAL (
        SELECT count(*) AS in_flight FROM relay._leases() ls
         WHERE ls.handler_id = h.id AND ls.lease_until > clock_timestamp()) l ON true
  LEFT JOIN LATERAL (
        SELECT count(*) AS dead FROM relay.dead_letters dl WHERE dl.handler_id = h.id) x ON true;

CREATE OR REPLACE VIEW relay.handler_metrics AS
SELECT current_database() AS database,
       h.name AS handler,
       h.kind,
       coalesce(t.published, 0)     AS published,
       coalesce(c.delivered, 0)     AS delivered,
       coalesce(c.retried, 0)       AS retried,
       coalesce(c.dead_lettered, 0) AS dead_lettered,
       coalesce(l.in_flight, 0)     AS in_flight,
       CASE WHEN counted.ok THEN coalesce(t.pending, 0) END AS pending,
       coalesce(extract(epoch FROM now() - relay._oldest_pending(h.id))::float8, 0) AS oldest_pending_seconds,
       coalesce(t.latency_sum_seconds, 0) AS latency_sum_seconds,
       coalesce(c.http_2xx, 0) AS http_2xx, coalesce(c.http_3xx, 0) AS http_3xx,
       coalesce(c.http_4xx, 0) AS http_4xx, coalesce(c.http_5xx, 0) AS http_5xx,
       coalesce(c.http_errors, 0) AS http_errors,
       coalesce(c.breaker_until > now(), false) AS breaker_open,
       coalesce(s.sends, 0) AS sends,
       coalesce(s.send_sum_seconds, 0) AS send_sum_seconds,
       coalesce(s.delivered_after_gap, 0) AS delivered_after_gap,
       coalesce(lim.held_back, 0) AS held_back,
       coalesce(lim.limited, false) AS limited
  FROM relay.handlers h
  CROSS JOIN relay._pending_counted() AS counted(ok)
  LEFT JOIN relay._handler_counters() c ON c.handler_id = h.id
  LEFT JOIN relay._handler_sends() s ON s.handler_id = h.id
  LEFT JOIN relay._handler_limits() lim ON lim.handler_id = h.id
  LEFT JOIN relay._handler_totals() t ON t.handler_id = h.id
  LEFT JOIN (SELECT ls.handler_id, count(*) AS in_flight FROM relay._leases() ls
              WHERE ls.lease_until > clock_timestamp() GROUP BY ls.handler_id) l ON l.handler_id = h.id;

-- ================================================================================
-- W3C Trace Context (issue 27, item 1): relay_claim returns the handover's
-- traceparent as a new last column (its result type changes: dropped and
-- created again, with the install's grant), and relay._trace_context_ignored()
-- counts the malformed values publishes left out (docs/tracing.md).
-- ================================================================================

DROP FUNCTION relay_claim(text, integer, interval, integer);
CREATE FUNCTION relay_claim(handler text, max integer DEFAULT 100, lease interval DEFAULT NULL,
                            per_key integer DEFAULT 1)
RETURNS TABLE (id bigint, event_id bigint, topic text, key text, seq bigint, payload jsonb,
               headers jsonb, attempt integer, priority integer, published_at timestamptz,
               lease_until timestamptz, lease uuid, traceparent text)
AS 'MODULE_PATHNAME', 'relay_claim' LANGUAGE C VOLATILE;
REVOKE EXECUTE ON FUNCTION relay_claim(text, integer, interval, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION relay_claim(text, integer, interval, integer) TO relay_consumer;

CREATE FUNCTION relay._trace_context_ignored() RETURNS bigint
AS 'MODULE_PATHNAME', 'relay_trace_context_ignored' LANGUAGE C VOLATILE;
REVOKE EXECUTE ON FUNCTION relay._trace_context_ignored() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION relay._trace_context_ignored() TO relay_monitor, relay_consumer;
