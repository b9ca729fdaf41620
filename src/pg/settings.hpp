// relaybus.* GUCs (see docs/configuration.md).
#pragma once

namespace relaybus::pg {

extern int guc_max_payload_bytes;
extern int guc_max_key_bytes;
extern int guc_priority_aging_ms;
extern int guc_max_leases;
extern int guc_claim_scan_limit;
extern bool guc_enabled;
extern char* guc_databases;
extern int guc_workers_per_database;
extern int guc_batch_size;
extern int guc_poll_interval_ms;
extern int guc_dispatcher_time_slice_us;
extern int guc_lease_timeout_ms;
extern int guc_max_in_flight;
extern int guc_notify_payload_limit;
extern char* guc_traceparent;
extern char* guc_tracestate;
extern char* guc_http_allowlist;
extern char* guc_otlp_endpoint;
extern char* guc_otlp_headers;
extern bool guc_worker_synchronous_commit;
extern int guc_dedupe_window_s;
extern int guc_dedupe_cleanup_interval_ms;
extern int guc_http_lease_margin_ms;

void define_settings();

}  // namespace relaybus::pg
