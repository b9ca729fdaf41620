#include "pg/trace_context.hpp"

#include "pg/cpp/trace_check.h"
#include "pg/settings.hpp"
#include "pg/shared_state.hpp"

extern "C" {
#include "common/pg_prng.h"
#include "tcop/tcopprot.h"
#include "utils/fmgrprotos.h"
#include "utils/json.h"
#include "utils/jsonb.h"
PG_FUNCTION_INFO_V1(relay_trace_context_ignored);
}

namespace relaybus::pg {

namespace {

constexpr int kTraceparentBuf = 128;  // longer ones are refused before they are read
constexpr int kTracestateBuf = 1024;  // more than 512: invalid, however it ends

// The key's value in a headers object: nullptr when absent; *is_string false
// when it is not a JSON string.
char* header_value(Jsonb* h, const char* key, bool* present, bool* is_string) {
  JsonbValue k;
  k.type = jbvString;
  k.val.string.val = const_cast<char*>(key);
  k.val.string.len = static_cast<int>(strlen(key));
  JsonbValue* v = findJsonbValueFromContainer(&h->root, JB_FOBJECT, &k);
  *present = v != nullptr;
  *is_string = v != nullptr && v->type == jbvString;
  if (!*is_string) return nullptr;
  return pnstrdup(v->val.string.val, v->val.string.len);
}

void count_ignored() {
  if (shared != nullptr) pg_atomic_fetch_add_u64(&shared->trace_context_ignored, 1);
}

void warn_traceparent(const char* source, const char* value) {
  count_ignored();
  ereport(WARNING, (errcode(ERRCODE_WARNING), errmsg("ignoring a malformed traceparent from %s", source),
                    errdetail("\"%.80s\" is not a W3C Trace Context traceparent; the event is published without one.",
                              value == nullptr ? "(not a string)" : value)));
}

void warn_tracestate(const char* source) {
  count_ignored();
  ereport(WARNING, (errcode(ERRCODE_WARNING), errmsg("ignoring a malformed tracestate from %s", source),
                    errdetail("A tracestate is at most 512 characters and 32 key=value members; the event is published "
                              "with its traceparent only.")));
}

bool traceparent_ok(const char* v) { return v != nullptr && trace_traceparent_ok(v, strlen(v)); }
bool tracestate_ok(const char* v) { return trace_tracestate_ok(v, strlen(v)); }

Datum without_key(Datum headers, const char* key) {
  return DirectFunctionCall2(jsonb_delete, headers, CStringGetTextDatum(key));
}

// headers (or {}) with traceparent and tracestate (when not empty) set.
void set_trace(PublishCommon* c, const char* traceparent, const char* tracestate) {
  StringInfoData buf;
  initStringInfo(&buf);
  appendStringInfoString(&buf, "{\"traceparent\": ");
  escape_json(&buf, traceparent);
  if (tracestate != nullptr && tracestate[0] != '\0') {
    appendStringInfoString(&buf, ", \"tracestate\": ");
    escape_json(&buf, tracestate);
  }
  appendStringInfoChar(&buf, '}');
  Datum trace = DirectFunctionCall1(jsonb_in, CStringGetDatum(buf.data));
  if (c->headers_null) {
    c->headers = trace;
    c->headers_null = false;
    return;
  }
  c->headers = DirectFunctionCall2(jsonb_concat, without_key(c->headers, "tracestate"), trace);
}

// A traceparent from a setting or a comment, with its tracestate: recorded
// if valid (false if not, warned).
bool use_source(PublishCommon* c, const char* source, const char* state_source, const char* traceparent,
                const char* tracestate) {
  if (!traceparent_ok(traceparent)) {
    warn_traceparent(source, traceparent);
    return false;
  }
  if (tracestate != nullptr && tracestate[0] != '\0' && !tracestate_ok(tracestate)) {
    warn_tracestate(state_source);
    tracestate = nullptr;
  }
  set_trace(c, traceparent, tracestate);
  return true;
}

}  // namespace

void publish_trace_context(PublishCommon* c) {
  if (!c->headers_null) {
    Jsonb* h = DatumGetJsonbP(c->headers);
    bool present = false, is_string = false;
    char* tp = header_value(h, "traceparent", &present, &is_string);
    if (present) {
      if (traceparent_ok(tp)) {
        bool state_present = false, state_string = false;
        char* ts = header_value(h, "tracestate", &state_present, &state_string);
        if (state_present && (!state_string || !tracestate_ok(ts))) {
          warn_tracestate("headers");
          c->headers = without_key(c->headers, "tracestate");
        }
        return;
      }
      warn_traceparent("headers", tp);
      c->headers = without_key(without_key(c->headers, "traceparent"), "tracestate");
    }
  }
  if (guc_traceparent != nullptr && guc_traceparent[0] != '\0' &&
      use_source(c, "relaybus.traceparent", "relaybus.tracestate", guc_traceparent, guc_tracestate))
    return;
  if (debug_query_string == nullptr) return;
  // One statement may publish many times (a SELECT over rows, a trigger):
  // its text is measured and scanned once, for the statement that began at
  // that time with that text.
  static const char* scanned_text = nullptr;
  static TimestampTz scanned_start = 0;
  static bool scanned_found = false;
  static char tp[kTraceparentBuf], ts[kTracestateBuf];
  TimestampTz start = GetCurrentStatementStartTimestamp();
  if (scanned_text != debug_query_string || scanned_start != start) {
    scanned_text = debug_query_string;
    scanned_start = start;
    scanned_found =
        trace_from_sqlcommenter(debug_query_string, strlen(debug_query_string), tp, sizeof tp, ts, sizeof ts);
  }
  if (scanned_found) (void)use_source(c, "a sqlcommenter comment", "a sqlcommenter comment", tp, ts);
}

char* handover_traceparent(Jsonb* headers, char** stored) {
  if (headers == nullptr) return nullptr;
  bool present = false, is_string = false;
  char* tp = header_value(headers, "traceparent", &present, &is_string);
  if (tp == nullptr) return nullptr;
  char out[kAttemptTraceparentSize];
  if (!trace_attempt_traceparent(tp, strlen(tp), pg_prng_uint64(&pg_global_prng_state), out)) return nullptr;
  if (stored != nullptr) *stored = tp;
  return pstrdup(out);
}

}  // namespace relaybus::pg

// relay._trace_context_ignored(): malformed traceparent and tracestate values
// that publishes left out, in every database since the server started.
extern "C" Datum relay_trace_context_ignored(PG_FUNCTION_ARGS) {
  if (relaybus::pg::shared == nullptr) PG_RETURN_NULL();
  PG_RETURN_INT64(static_cast<int64>(pg_atomic_read_u64(&relaybus::pg::shared->trace_context_ignored)));
}
