#pragma once

// CloudEvents 1.0 for http and kafka handlers (option "cloudevents"): the
// attributes a delivery maps to and the two protocol bindings' binary and
// structured modes. One builder for the extension, relaybus-mongo and
// relaybus-agent, so a receiver sees the same event from every edition.
// docs/webhooks.md ("CloudEvents") and docs/kafka.md describe the mapping.

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "handler_config.hpp"
#include "webhook_delivery.hpp"

namespace relaybus::core {

// prefix followed by the database name, percent-encoded where it is not an
// RFC 3986 unreserved character: "/relaybus/" + "shop db" -> "/relaybus/shop%20db".
std::string default_cloudevents_source(std::string_view prefix, std::string_view database);

// The source a handler's events carry: its option, else its host's default.
const std::string& cloudevents_source(const HandlerOptions& options);

// How the binding names attribute headers: HTTP "ce-id" with values
// percent-encoded as the HTTP binding asks; Kafka "ce_id" as they are.
enum class CloudEventsBinding { Http, Kafka };

struct CloudEventMessage {
  std::vector<std::pair<std::string, std::string>> headers;  // content-type first
  std::string body;
};

// The message of a delivery in the handler's mode (options.cloudevents must
// not be Off). Attributes: specversion 1.0; id the event id (the same for
// every attempt and handler); source; type the wire name; time the publish
// time (absent when unknown); subject the ordering key and the extension
// relaybusseq its seq (both absent when unkeyed); relaybusattempt; the
// distributed-tracing extension's traceparent and tracestate (the attempt's,
// message.trace, when the event has a trace context); data the
// payload with datacontenttype application/json. Binary: attributes as
// headers, body the payload. Structured: the JSON event as the body, with
// content-type application/cloudevents+json.
CloudEventMessage make_cloudevent(const HandlerOptions& options, const WebhookMessage& message,
                                  CloudEventsBinding binding);

}  // namespace relaybus::core
