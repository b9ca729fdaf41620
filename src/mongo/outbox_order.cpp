#include "mongo/outbox_order.hpp"

#include <cmath>
#include <cstring>
#include <iterator>

namespace relaybus::mongo {

namespace {

// MongoDB's comparison order of BSON types.
char type_rank(bson_type_t t) {
  switch (t) {
    case BSON_TYPE_MINKEY:
      return 1;
    case BSON_TYPE_UNDEFINED:
    case BSON_TYPE_NULL:
      return 2;
    case BSON_TYPE_INT32:
    case BSON_TYPE_INT64:
    case BSON_TYPE_DOUBLE:
    case BSON_TYPE_DECIMAL128:
      return 3;
    case BSON_TYPE_SYMBOL:
    case BSON_TYPE_UTF8:
      return 4;
    case BSON_TYPE_DOCUMENT:
      return 5;
    case BSON_TYPE_ARRAY:
      return 6;
    case BSON_TYPE_BINARY:
      return 7;
    case BSON_TYPE_OID:
      return 8;
    case BSON_TYPE_BOOL:
      return 9;
    case BSON_TYPE_DATE_TIME:
      return 10;
    case BSON_TYPE_TIMESTAMP:
      return 11;
    case BSON_TYPE_REGEX:
      return 12;
    case BSON_TYPE_MAXKEY:
      return 14;
    default:
      return 13;
  }
}

void append_be(std::string& out, uint64_t v) {
  for (int i = 7; i >= 0; i--) out.push_back(static_cast<char>(v >> (8 * i)));
}
// Signed integers in an unsigned, bytewise order.
void append_int(std::string& out, int64_t v) { append_be(out, static_cast<uint64_t>(v) ^ (1ull << 63)); }
// Doubles in bytewise order (negatives have every bit flipped).
void append_double(std::string& out, double d) {
  if (std::isnan(d)) d = -INFINITY;  // MongoDB sorts NaN below every number
  if (d == 0) d = 0;                 // -0 == 0
  uint64_t u;
  std::memcpy(&u, &d, sizeof u);
  append_be(out, (u >> 63) ? ~u : u | (1ull << 63));
}

}  // namespace

std::string outbox_order_key(const bson_t* doc) {
  bson_iter_t it;
  if (!bson_iter_init_find(&it, doc, "_id")) return std::string(1, '\0');
  const bson_value_t* v = bson_iter_value(&it);
  std::string key(1, type_rank(v->value_type));
  switch (v->value_type) {
    case BSON_TYPE_INT32:
      append_double(key, v->value.v_int32);
      append_int(key, v->value.v_int32);
      break;
    case BSON_TYPE_INT64:
      // The double first (numbers of every type by value), the exact value
      // to tell apart int64s that round to one double.
      append_double(key, static_cast<double>(v->value.v_int64));
      append_int(key, v->value.v_int64);
      break;
    case BSON_TYPE_DOUBLE:
      append_double(key, v->value.v_double);
      append_int(key, static_cast<int64_t>(v->value.v_double));
      break;
    case BSON_TYPE_UTF8:
      key.append(v->value.v_utf8.str, v->value.v_utf8.len);
      break;
    case BSON_TYPE_OID:
      key.append(reinterpret_cast<const char*>(v->value.v_oid.bytes), 12);
      break;
    case BSON_TYPE_BOOL:
      key.push_back(v->value.v_bool ? 1 : 0);
      break;
    case BSON_TYPE_DATE_TIME:
      append_int(key, v->value.v_datetime);
      break;
    default: {
      // Other types: a consistent order (their stored bytes), not MongoDB's.
      bson_t one = BSON_INITIALIZER;
      bson_append_value(&one, "", 0, v);
      key.append(reinterpret_cast<const char*>(bson_get_data(&one)), one.len);
      bson_destroy(&one);
    }
  }
  return key;
}

void OutboxSnapshot::add(const bson_t* doc) {
  std::string key = outbox_order_key(doc);
  if (!ceiling_.empty() && key >= ceiling_) return;
  bytes_ += doc->len;
  kept_.emplace(std::move(key), std::shared_ptr<bson_t>(bson_copy(doc), bson_destroy));
  while (kept_.size() > 1 && (kept_.size() > max_docs_ || bytes_ > max_bytes_)) {
    auto last = std::prev(kept_.end());
    bytes_ -= last->second->len;
    ceiling_ = last->first;
    kept_.erase(last);
  }
}

namespace {
constexpr size_t kOidKeyLen = 13;    // rank + 12 bytes
constexpr size_t kOidGroupLen = 10;  // rank + seconds + the driver's 5 process bytes
constexpr uint32_t kCounterSpan = 1u << 24;

bool is_oid_key(const std::string& k) { return k.size() == kOidKeyLen && k[0] == type_rank(BSON_TYPE_OID); }
uint32_t counter_of(const std::string& k) {
  return (uint32_t(uint8_t(k[10])) << 16) | (uint32_t(uint8_t(k[11])) << 8) | uint8_t(k[12]);
}
}  // namespace

// A driver's ObjectId is seconds, 5 random bytes per process and a 3-byte
// counter that starts at a random value and wraps after 2^24 ids: within one
// second, a process's ids made after the wrap sort before those made before
// it. Such a group (same seconds and process bytes) is put back in counter
// order starting after its widest gap. Ids of `relaybus-mongo publish`
// (seconds, microseconds, random) of one process never share a group: each
// has its own microsecond. A snapshot cut by the cap drops its last group,
// whose earlier half may lie beyond the cut.
std::vector<std::shared_ptr<bson_t>> OutboxSnapshot::take() {
  std::vector<std::pair<std::string, std::shared_ptr<bson_t>>> v(std::make_move_iterator(kept_.begin()),
                                                                 std::make_move_iterator(kept_.end()));
  kept_.clear();
  bytes_ = 0;
  auto same_group = [&](size_t a, size_t b) {
    return is_oid_key(v[a].first) && is_oid_key(v[b].first) &&
           v[a].first.compare(0, kOidGroupLen, v[b].first, 0, kOidGroupLen) == 0;
  };
  if (truncated() && !v.empty()) {
    size_t first = v.size() - 1;
    while (first > 0 && same_group(first - 1, v.size() - 1)) first--;
    if (first > 0) v.resize(first);  // else one group fills the cap: kept whole, in plain order
  }
  std::vector<std::shared_ptr<bson_t>> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size();) {
    size_t j = i + 1;
    while (j < v.size() && same_group(i, j)) j++;
    size_t start = i;  // after the widest gap between neighbours, if wider than the wrap's
    uint32_t widest = j - i > 1 ? counter_of(v[i].first) + kCounterSpan - counter_of(v[j - 1].first) : 0;
    for (size_t k = i + 1; k < j; k++) {
      const uint32_t gap = counter_of(v[k].first) - counter_of(v[k - 1].first);
      if (gap > widest) widest = gap, start = k;
    }
    for (size_t k = start; k < j; k++) out.push_back(std::move(v[k].second));
    for (size_t k = i; k < start; k++) out.push_back(std::move(v[k].second));
    i = j;
  }
  return out;
}

}  // namespace relaybus::mongo
