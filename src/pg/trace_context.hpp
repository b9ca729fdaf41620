// W3C Trace Context in the extension (docs/tracing.md): what relay_publish
// records in an event's headers, and the traceparent a handover (NOTIFY,
// relay_claim) carries as a new span.
#pragma once

#include "pg/pg_includes.hpp"
#include "pg/publish_args.hpp"

namespace relaybus::pg {

// The publish's trace context into common->headers: a valid traceparent of
// the headers argument, else relaybus.traceparent / relaybus.tracestate, else
// a sqlcommenter comment of the top-level statement. A malformed value is
// left out with a WARNING and counted (relay._trace_context_ignored()).
void publish_trace_context(PublishCommon* common);

// The traceparent this handover of a delivery carries (the stored one's
// trace-id and flags, a new span id), palloc'd; nullptr when its headers hold
// no valid one. stored (when not nullptr): the publisher's, palloc'd.
char* handover_traceparent(Jsonb* headers, char** stored = nullptr);

}  // namespace relaybus::pg
