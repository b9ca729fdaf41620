#include "mongo/outbox.hpp"

#include <time.h>

#include <random>
#include <vector>

#include "core/topic.hpp"
#include "mongo/util.hpp"

namespace relaybus::mongo {

OutboxEntry parse_outbox_doc(const bson_t* doc, int max_key_bytes) {
  OutboxEntry e;
  std::vector<std::string> problems;
  bson_iter_t it;
  if (bson_iter_init_find(&it, doc, "_id")) e.id_json = bson_value_to_json(bson_iter_value(&it));
  if (!get_string(doc, "topic", &e.topic) || !core::is_valid_topic(e.topic, nullptr))
    problems.push_back("topic must be a valid topic");
  if (!bson_iter_init_find(&it, doc, "payload")) problems.push_back("payload is missing");
  if (bson_iter_init_find(&it, doc, "key") && !BSON_ITER_HOLDS_NULL(&it)) {
    if (!get_string(doc, "key", &e.key) || e.key.empty())
      problems.push_back("key must be a non-empty string or absent");
    else if (static_cast<int>(e.key.size()) > max_key_bytes)
      problems.push_back("key is longer than max_key_bytes (" + std::to_string(max_key_bytes) + ")");
    else
      e.has_key = true;
  }
  int64_t x = 0;
  if (bson_iter_init_find(&it, doc, "priority") && !BSON_ITER_HOLDS_NULL(&it)) {
    if (get_int64(doc, "priority", &x) && x >= 0 && x <= 3)
      e.priority = static_cast<int>(x);
    else
      problems.push_back("priority must be an integer 0..3");
  }
  if (bson_iter_init_find(&it, doc, "headers") && !BSON_ITER_HOLDS_NULL(&it) && !BSON_ITER_HOLDS_DOCUMENT(&it))
    problems.push_back("headers must be an object or absent");
  if (bson_iter_init_find(&it, doc, "not_before") && !BSON_ITER_HOLDS_NULL(&it)) {
    if (get_date_ms(doc, "not_before", &e.not_before_ms))
      e.has_not_before = true;
    else
      problems.push_back("not_before must be a date");
  }
  if (bson_iter_init_find(&it, doc, "dedupe_key") && !BSON_ITER_HOLDS_NULL(&it) &&
      (!get_string(doc, "dedupe_key", &e.dedupe_key) || e.dedupe_key.empty()))
    problems.push_back("dedupe_key must be a non-empty string or absent");
  if (!problems.empty()) {
    e.malformed = "malformed outbox document: ";
    for (size_t i = 0; i < problems.size(); i++) e.malformed += (i ? "; " : "") + problems[i];
  }
  return e;
}

bool build_outbox_doc(const OutboxMessage& m, bson_t* out, std::string* oid_hex, std::string* why) {
  // An ObjectId that orders by time to the microsecond: 4 bytes of seconds (as
  // every ObjectId), 4 of microseconds, 4 random. The sequencer takes the
  // outbox in _id order, and a driver's ObjectIds from different processes
  // order within one second by their process's random bytes, not by time: so
  // two `publish` runs of one key, one after the other, keep their order.
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  const uint32_t secs = static_cast<uint32_t>(ts.tv_sec), usec = static_cast<uint32_t>(ts.tv_nsec / 1000);
  std::random_device rd;
  const uint32_t rnd = rd();
  uint8_t raw[12];
  for (int i = 0; i < 4; i++) {
    raw[i] = static_cast<uint8_t>(secs >> (24 - 8 * i));
    raw[4 + i] = static_cast<uint8_t>(usec >> (24 - 8 * i));
    raw[8 + i] = static_cast<uint8_t>(rnd >> (24 - 8 * i));
  }
  bson_oid_t oid;
  bson_oid_init_from_data(&oid, raw);
  char hex[25];
  bson_oid_to_string(&oid, hex);
  *oid_hex = hex;
  BSON_APPEND_OID(out, "_id", &oid);
  BSON_APPEND_UTF8(out, "topic", m.topic.c_str());
  if (!append_json_value(out, "payload", m.payload_json, why)) return false;
  if (m.key) BSON_APPEND_UTF8(out, "key", m.key->c_str());
  if (!m.headers_json.empty() && !append_json_value(out, "headers", m.headers_json, why)) return false;
  if (m.priority) BSON_APPEND_INT32(out, "priority", *m.priority);
  if (m.not_before_ms > 0) BSON_APPEND_DATE_TIME(out, "not_before", m.not_before_ms);
  if (!m.dedupe_key.empty()) BSON_APPEND_UTF8(out, "dedupe_key", m.dedupe_key.c_str());
  return true;
}

}  // namespace relaybus::mongo
