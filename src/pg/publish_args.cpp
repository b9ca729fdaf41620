#include "pg/publish_args.hpp"

#include "pg/boundary.hpp"
#include "pg/cpp/topic_check.h"
#include "pg/settings.hpp"
#include "pg/spi_support.hpp"
#include "pg/trace_context.hpp"

extern "C" {
#include "access/detoast.h"
}

namespace relaybus::pg {

void read_publish_common(FunctionCallInfo fcinfo, int headers_arg, int priority_arg, int not_before_arg,
                         PublishCommon* out) {
  if (PG_ARGISNULL(0)) ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED), errmsg("topic must not be NULL")));
  int topic_len = 0;
  out->topic = text_arg(fcinfo, 0, &topic_len);
  ErrorRecord err;
  if (!check_topic(out->topic, topic_len, &err)) raise_error(&err);

  out->headers_null = PG_ARGISNULL(headers_arg);
  out->headers = out->headers_null ? (Datum)0 : PG_GETARG_DATUM(headers_arg);
  if (!out->headers_null) {
    Jsonb* h = DatumGetJsonbP(out->headers);
    if (!JB_ROOT_IS_OBJECT(h) || JB_ROOT_IS_SCALAR(h))
      ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("headers must be a JSON object")));
    out->headers = PointerGetDatum(h);
  }
  publish_trace_context(out);

  if (PG_ARGISNULL(priority_arg))
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("priority must be between 0 and 3, not NULL")));
  out->priority = PG_GETARG_INT32(priority_arg);
  if (out->priority < 0 || out->priority > 3)
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                    errmsg("priority must be between 0 and 3, not %d", out->priority),
                    errhint("0 is the lowest class and 3 the highest; the default is 1.")));

  out->not_before_null = PG_ARGISNULL(not_before_arg);
  out->not_before = out->not_before_null ? 0 : PG_GETARG_TIMESTAMPTZ(not_before_arg);
  if (!out->not_before_null && TIMESTAMP_NOT_FINITE(out->not_before))
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("not_before must be a finite time")));
}

void check_payload_size(Datum payload, int element) {
  Size size = toast_raw_datum_size(payload) - VARHDRSZ;
  if (size > static_cast<Size>(guc_max_payload_bytes)) {
    if (element > 0)
      ereport(ERROR, (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
                      errmsg("payload is too large: payloads[%d] is %zu bytes", element, size),
                      errdetail("relaybus.max_payload_bytes is %d.", guc_max_payload_bytes)));
    ereport(ERROR, (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED), errmsg("payload is too large: %zu bytes", size),
                    errdetail("relaybus.max_payload_bytes is %d.", guc_max_payload_bytes)));
  }
}

void check_key(const char* key, int len, int element) {
  (void)key;
  if (len > guc_max_key_bytes) {
    if (element > 0)
      ereport(ERROR, (errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
                      errmsg("key is too long: keys[%d] is %d bytes", element, len),
                      errdetail("relaybus.max_key_bytes is %d.", guc_max_key_bytes)));
    ereport(ERROR, (errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION), errmsg("key is too long: %d bytes", len),
                    errdetail("relaybus.max_key_bytes is %d.", guc_max_key_bytes)));
  }
  if (len == 0) {
    if (element > 0)
      ereport(ERROR,
              (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("key must not be empty: keys[%d] is ''", element),
               errhint("Use NULL for an event without an ordering key.")));
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("key must not be empty"),
                    errhint("Pass NULL for an event without an ordering key.")));
  }
}

}  // namespace relaybus::pg
