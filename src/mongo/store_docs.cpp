#include "mongo/store_docs.hpp"

#include <cstring>

namespace relaybus::mongo {

std::vector<std::pair<int, int>> write_errors(const bson_t* reply) {
  std::vector<std::pair<int, int>> out;
  bson_iter_t it, arr;
  if (!bson_iter_init_find(&it, reply, "writeErrors") || !BSON_ITER_HOLDS_ARRAY(&it)) return out;
  if (!bson_iter_recurse(&it, &arr)) return out;
  while (bson_iter_next(&arr)) {
    bson_iter_t e;
    if (!BSON_ITER_HOLDS_DOCUMENT(&arr) || !bson_iter_recurse(&arr, &e)) continue;
    int index = -1, code = 0;
    while (bson_iter_next(&e)) {
      if (strcmp(bson_iter_key(&e), "index") == 0) index = static_cast<int>(bson_iter_as_int64(&e));
      if (strcmp(bson_iter_key(&e), "code") == 0) code = static_cast<int>(bson_iter_as_int64(&e));
    }
    out.emplace_back(index, code);
  }
  return out;
}

namespace {

template <typename T, typename Add>
void append_array(bson_t* parent, const char* name, const std::vector<T>& v, Add add) {
  bson_t arr;
  bson_append_array_begin(parent, name, -1, &arr);
  char keybuf[16];
  for (size_t i = 0; i < v.size(); i++) {
    const char* k;
    bson_uint32_to_string(static_cast<uint32_t>(i), &k, keybuf, sizeof keybuf);
    add(&arr, k, v[i]);
  }
  bson_append_array_end(parent, &arr);
}

}  // namespace

void append_int64_array(bson_t* parent, const char* name, const std::vector<int64_t>& v) {
  append_array(parent, name, v, [](bson_t* a, const char* k, int64_t x) { bson_append_int64(a, k, -1, x); });
}

void append_int32_array(bson_t* parent, const char* name, const std::vector<int>& v) {
  append_array(parent, name, v, [](bson_t* a, const char* k, int x) { bson_append_int32(a, k, -1, x); });
}

void id_in(bson_t* filter, const std::vector<int64_t>& ids) {
  bson_t in;
  bson_append_document_begin(filter, "_id", 3, &in);
  append_int64_array(&in, "$in", ids);
  bson_append_document_end(filter, &in);
}

void not_dropped(bson_t* filter) {
  bson_t ex;
  bson_append_document_begin(filter, "handler_dropped_at", -1, &ex);
  BSON_APPEND_BOOL(&ex, "$exists", false);
  bson_append_document_end(filter, &ex);
}

}  // namespace relaybus::mongo
