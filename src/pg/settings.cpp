#include "pg/pg_includes.hpp"
#include "pg/settings.hpp"

#include "pg/cpp/pipeline_host.h"

namespace relaybus::pg {

int guc_max_payload_bytes = 1024 * 1024;
int guc_max_key_bytes = 512;
int guc_priority_aging_ms = 10000;
int guc_max_leases = 65536;
int guc_claim_scan_limit = 10000;
bool guc_enabled = true;
char* guc_databases = nullptr;
int guc_workers_per_database = 1;
int guc_batch_size = 500;
int guc_poll_interval_ms = 1000;
int guc_dispatcher_time_slice_us = 100;
int guc_lease_timeout_ms = 30000;
int guc_max_in_flight = 10000;
int guc_notify_payload_limit = 7900;
char* guc_http_allowlist = nullptr;
bool guc_worker_synchronous_commit = false;
int guc_dedupe_window_s = 86400;
int guc_dedupe_cleanup_interval_ms = 10000;
int guc_http_lease_margin_ms = 30000;
char* guc_traceparent = nullptr;
char* guc_tracestate = nullptr;
char* guc_otlp_endpoint = nullptr;
char* guc_otlp_headers = nullptr;

// A bad endpoint or header list is refused where it is set (a reload keeps
// the old value and logs why) rather than found by a dispatcher later.
static bool check_otlp(char** newval, bool endpoint) {
  char why[256] = "";
  if (host_otlp_valid(endpoint ? *newval : "", endpoint ? "" : *newval, why, sizeof why)) return true;
  GUC_check_errcode(ERRCODE_INVALID_PARAMETER_VALUE);
  GUC_check_errdetail("%s", why);
  return false;
}
static bool check_otlp_endpoint(char** newval, void**, GucSource) { return check_otlp(newval, true); }
static bool check_otlp_headers(char** newval, void**, GucSource) { return check_otlp(newval, false); }

void define_settings() {
  DefineCustomIntVariable(
      "relaybus.dedupe_window", "How long a publish's dedupe_key keeps naming its event.",
      "A publish with the same dedupe_key within it returns the first event's id and creates nothing.",
      &guc_dedupe_window_s, 86400, 1, INT_MAX, PGC_USERSET, GUC_UNIT_S, nullptr, nullptr, nullptr);
  DefineCustomIntVariable("relaybus.max_payload_bytes", "Largest payload relay_publish accepts, in bytes.",
                          "Measured on the jsonb value as stored, before compression.", &guc_max_payload_bytes,
                          1024 * 1024, 1, MaxAllocSize - 1, PGC_SUSET, GUC_UNIT_BYTE, nullptr, nullptr, nullptr);
  DefineCustomIntVariable("relaybus.max_key_bytes", "Longest ordering key, in bytes.", nullptr, &guc_max_key_bytes, 512,
                          1, 2048, PGC_SUSET, GUC_UNIT_BYTE, nullptr, nullptr, nullptr);
  DefineCustomIntVariable("relaybus.priority_aging",
                          "Waiting time after which a delivery counts one priority class higher.",
                          "0 disables aging (strict priority).", &guc_priority_aging_ms, 10000, 0, INT_MAX, PGC_SUSET,
                          GUC_UNIT_MS, nullptr, nullptr, nullptr);
  DefineCustomIntVariable("relaybus.max_leases", "Deliveries that can be leased (in flight) at once, cluster-wide.",
                          "Sizes a shared memory table; a claim past it returns fewer rows.", &guc_max_leases, 65536,
                          64, 16 * 1024 * 1024, PGC_POSTMASTER, 0, nullptr, nullptr, nullptr);
  DefineCustomIntVariable("relaybus.claim_scan_limit", "Most pending rows one claim looks at to find ready ones.",
                          "Bounds the work of a claim when many keys are blocked behind failing deliveries.",
                          &guc_claim_scan_limit, 10000, 100, INT_MAX, PGC_SUSET, 0, nullptr, nullptr, nullptr);
  DefineCustomBoolVariable("relaybus.enabled", "Whether the background workers deliver.",
                           "Off stops the dispatchers; publishing and the pull API keep working.", &guc_enabled, true,
                           PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
  DefineCustomStringVariable("relaybus.databases", "Databases the workers serve (comma-separated names).",
                             "Empty: every database in which the extension is installed.", &guc_databases, "",
                             PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
  DefineCustomIntVariable("relaybus.workers_per_database", "Dispatchers per database.",
                          "They share the 64 lanes between them.", &guc_workers_per_database, 1, 1, 8, PGC_SIGHUP, 0,
                          nullptr, nullptr, nullptr);
  DefineCustomIntVariable("relaybus.batch_size", "Most deliveries a dispatcher hands over per handler per transaction.",
                          nullptr, &guc_batch_size, 500, 1, 10000, PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
  DefineCustomIntVariable("relaybus.poll_interval", "How long an idle dispatcher sleeps between looks at the tables.",
                          "A fallback only: publishers and catalog changes wake the dispatchers at commit.",
                          &guc_poll_interval_ms, 1000, 10, 3600000, PGC_SIGHUP, GUC_UNIT_MS, nullptr, nullptr, nullptr);
  DefineCustomIntVariable("relaybus.lease_timeout", "How long a lane stays with a dispatcher that stopped renewing it.",
                          "After this a live dispatcher takes over the lanes of a stuck one.", &guc_lease_timeout_ms,
                          30000, 1000, 3600000, PGC_SIGHUP, GUC_UNIT_MS, nullptr, nullptr, nullptr);
  DefineCustomIntVariable(
      "relaybus.dedupe_cleanup_interval",
      "How often a dispatcher removes relay.dedupe rows past their window (a bounded batch each time).", nullptr,
      &guc_dedupe_cleanup_interval_ms, 10000, 100, 3600000, PGC_SIGHUP, GUC_UNIT_MS, nullptr, nullptr, nullptr);
  DefineCustomIntVariable(
      "relaybus.http_lease_margin",
      "How much longer than an http handler's timeout its deliveries' leases last, at least.",
      "A request still queued when less than half of it is left is not sent, and its lease goes back.",
      &guc_http_lease_margin_ms, 30000, 1000, 3600000, PGC_SIGHUP, GUC_UNIT_MS, nullptr, nullptr, nullptr);
  DefineCustomIntVariable("relaybus.max_in_flight",
                          "Most deliveries one dispatcher keeps handed over but unacknowledged.",
                          "Counts notify deliveries in ack mode waiting for relay_ack.", &guc_max_in_flight, 10000, 1,
                          1000000, PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
  DefineCustomIntVariable("relaybus.notify_payload_limit",
                          "Largest NOTIFY payload sent inline; larger deliveries are sent by reference.",
                          "PostgreSQL's own limit is 8000 bytes.", &guc_notify_payload_limit, 7900, 200, 7999,
                          PGC_SIGHUP, GUC_UNIT_BYTE, nullptr, nullptr, nullptr);
  DefineCustomStringVariable("relaybus.traceparent",
                             "W3C traceparent recorded with the events this session publishes (SET LOCAL).",
                             "Used when relay_publish's headers carry none; empty: none.", &guc_traceparent, "",
                             PGC_USERSET, 0, nullptr, nullptr, nullptr);
  DefineCustomStringVariable("relaybus.tracestate", "W3C tracestate recorded with relaybus.traceparent.",
                             "Empty: none.", &guc_tracestate, "", PGC_USERSET, 0, nullptr, nullptr, nullptr);
  DefineCustomStringVariable("relaybus.otlp_endpoint",
                             "OTLP/HTTP endpoint the dispatchers export a span per traced delivery attempt to.",
                             "e.g. http://127.0.0.1:4318 (/v1/traces is appended). Empty: no spans.",
                             &guc_otlp_endpoint, "", PGC_SIGHUP, 0, check_otlp_endpoint, nullptr, nullptr);
  DefineCustomStringVariable("relaybus.otlp_headers", "HTTP headers sent with every span export request.",
                             "name=value pairs, comma-separated, e.g. 'api-key=secret'. Shown to superusers only.",
                             &guc_otlp_headers, "", PGC_SIGHUP, GUC_SUPERUSER_ONLY, check_otlp_headers, nullptr,
                             nullptr);
  DefineCustomStringVariable(
      "relaybus.http_allowlist",
      "Hosts and CIDRs that http handlers may call although they are loopback, private, link-local or metadata addresses.",
      "Comma-separated, e.g. 'localhost, 127.0.0.0/8, 10.1.0.0/16'. Empty: only public addresses.", &guc_http_allowlist,
      "", PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
  DefineCustomBoolVariable(
      "relaybus.worker_synchronous_commit", "Whether dispatchers wait for their completing commits to reach disk.",
      "Off (the default): a crash can forget the last completions, and those deliveries are "
      "handed over again (at least once, as after any crash). On: each completing commit waits for its WAL flush.",
      &guc_worker_synchronous_commit, false, PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
  DefineCustomIntVariable(
      "relaybus.dispatcher_time_slice_us",
      "CPU time slice, in microseconds, the dispatchers ask the kernel for; 0 keeps the kernel's default.",
      "A short slice (Linux 6.12+) lets a woken dispatcher run sooner on a busy machine; "
      "its share of CPU stays the same. Ignored where the kernel does not support it.",
      &guc_dispatcher_time_slice_us, 100, 0, 100000, PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
  MarkGUCPrefixReserved("relaybus");
}

}  // namespace relaybus::pg
