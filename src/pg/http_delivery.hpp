// Webhook callouts and Kafka messages from a dispatcher: the PostgreSQL side
// of the core's delivery pipeline (core/delivery_pipeline.hpp), over its HTTP
// engine and its Kafka producers (core/kafka_sink.hpp) behind one
// core::RoutingSink: a kafka handler is claimed, leased, retried,
// dead-lettered and completed exactly as an http one.
//
// Claiming happens in the dispatcher's transaction (leases in shared memory,
// no row written); the requests are sent after that transaction committed and
// run while the dispatcher waits on its latch and the engine's sockets, with no
// transaction open; the results are completed in a transaction of their own:
// delete on 2xx, nack with backoff (honouring Retry-After) on 408/429/5xx and
// network errors, dead letter on other 4xx.
#pragma once

#include "pg/catalog_cache.hpp"
#include "pg/claim.hpp"
#include "pg/pg_includes.hpp"

namespace relaybus::pg {

// How many more deliveries of h may be claimed now: claims run ahead of the
// handler's concurrency (queued requests go out as responses come in), and
// only once a good part of that is free; with the circuit breaker open, no
// more than it may send (0, or 1 for the probe).
int http_capacity(const HandlerEntry* h);
// Lease of a claimed delivery: covers the request's timeout.
int64 http_lease_ms(const HandlerEntry* h);
// Within the dispatcher's transaction and SPI: turns the claimed rows into
// requests to send once the transaction has committed.
void http_stage(const HandlerEntry* h, const ClaimResult* res);
void http_send_staged();  // after commit: queues them and sends what has room
void http_drop_staged();  // after an aborted iteration
// Sends queued requests that have room now; gives back the leases of those
// queued too long to be sent within their lease.
void http_pump();
// Drops every queued request and gives its lease back (the dispatcher stops).
void http_release_queued();
// Moves finished requests out of the engine; returns how many wait for completion.
int http_collect();
// The pipeline's batching rule: 16 results, or the oldest waited 2 ms, or
// nothing is in flight (core::DeliveryPipeline::completion_due).
bool http_completion_due();
// Completes finished requests in one transaction; returns how many. If that
// fails, they stay for a later try (their leases fence a late completion).
int http_complete();
size_t http_in_flight();                         // http requests and kafka messages
size_t http_outstanding(const HandlerEntry* h);  // the handler's, queued or in flight
// Closes the kafka producers of handlers not among ids (dropped, paused or
// no longer kafka); their messages in flight still complete.
void http_retain_kafka(const int32* ids, int n);
// The dispatcher stops (disabled, SIGTERM): the requests in flight get a
// short while to finish, and what finished is completed; errors are logged.
void drain_http_on_exit(MemoryContext cxt);
void http_shutdown();
// Span export, every loop pass: follows relaybus.otlp_endpoint and
// relaybus.otlp_headers (a reload applies at the next pass), sends what is
// due, and logs a failed export (at most once a minute, with the counters).
void otlp_pump();
// How long the loop may sleep before otlp_pump has work: -1 none.
long otlp_wait_ms();
// The spans of the NOTIFYs an iteration sent for traced deliveries
// (notify_sink.cpp stages them): to the exporter once the transaction
// committed, dropped when it aborted.
void otlp_notify_sent();
void otlp_notify_dropped();
// This dispatcher's share of its database's shared limits (its worker_index,
// worker_state.hpp HandlerLimit): what an earlier dispatcher of that index
// held is given back, and is again when this one exits.
void http_limits_start(Oid dboid, int share);
void http_limits_exit();

}  // namespace relaybus::pg
