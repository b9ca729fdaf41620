// Argument checks shared by relay_publish and relay_publish_batch.
#pragma once

#include "pg/pg_includes.hpp"

namespace relaybus::pg {

constexpr int kMaxBatch = 10000;

struct PublishCommon {
  char* topic;
  int priority;
  Datum headers;
  bool headers_null;
  TimestampTz not_before;
  bool not_before_null;
};

// Reads and checks topic (argument 0), headers, priority and not_before.
void read_publish_common(FunctionCallInfo fcinfo, int headers_arg, int priority_arg, int not_before_arg,
                         PublishCommon* out);
// element: 1-based position in a batch, or -1 for a single publish.
void check_payload_size(Datum payload, int element);
void check_key(const char* key, int len, int element);

}  // namespace relaybus::pg
