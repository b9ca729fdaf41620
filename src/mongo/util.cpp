#include "mongo/util.hpp"

#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "core/text_util.hpp"

namespace relaybus::mongo {

namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::Info)};
const char* level_name(LogLevel l) {
  switch (l) {
    case LogLevel::Debug:
      return "debug";
    case LogLevel::Info:
      return "info";
    case LogLevel::Warn:
      return "warn";
    case LogLevel::Error:
      return "error";
  }
  return "info";
}
}  // namespace

bool parse_log_level(std::string_view text, LogLevel* out) {
  for (LogLevel l : {LogLevel::Debug, LogLevel::Info, LogLevel::Warn, LogLevel::Error})
    if (text == level_name(l)) {
      *out = l;
      return true;
    }
  return false;
}

void set_log_level(LogLevel level) { g_level = static_cast<int>(level); }

void log(LogLevel level, std::string_view msg, nlohmann::json fields) {
  if (static_cast<int>(level) < g_level.load()) return;
  nlohmann::json line = nlohmann::json::object();
  line["ts"] = iso8601_ms(wall_ms());
  line["level"] = level_name(level);
  line["msg"] = std::string(msg);
  if (fields.is_object())
    for (auto& [k, v] : fields.items()) line[k] = v;
  std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  text += '\n';
  fwrite(text.data(), 1, text.size(), stderr);
  fflush(stderr);
}

int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t monotonic_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string iso8601_ms(int64_t ms) {
  time_t s = static_cast<time_t>(ms / 1000);
  struct tm tm;
  gmtime_r(&s, &tm);
  char buf[64];
  snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
           tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms % 1000));
  return buf;
}

std::string bson_value_to_json(const bson_value_t* value) {
  bson_t tmp;
  bson_init(&tmp);
  bson_append_value(&tmp, "v", 1, value);
  size_t len = 0;
  char* s = bson_as_relaxed_extended_json(&tmp, &len);
  bson_destroy(&tmp);
  std::string out = s != nullptr ? std::string(s, len) : std::string("null");
  bson_free(s);
  // "{ "v" : VALUE }"
  static const std::string_view prefix = "{ \"v\" : ";
  static const std::string_view suffix = " }";
  if (out.size() >= prefix.size() + suffix.size() && out.compare(0, prefix.size(), prefix) == 0)
    return out.substr(prefix.size(), out.size() - prefix.size() - suffix.size());
  return "null";
}

bool append_json_value(bson_t* doc, const char* name, std::string_view json_text, std::string* why) {
  // nlohmann gives the clearer message (byte position); libbson then builds the value.
  try {
    nlohmann::json parsed = nlohmann::json::parse(json_text);
    (void)parsed;
  } catch (const nlohmann::json::parse_error& e) {
    *why = std::string("invalid JSON: ") + e.what();
    return false;
  }
  std::string wrapped = "{\"v\":";
  wrapped.append(json_text);
  wrapped += "}";
  bson_error_t err;
  bson_t* parsed =
      bson_new_from_json(reinterpret_cast<const uint8_t*>(wrapped.data()), static_cast<ssize_t>(wrapped.size()), &err);
  if (parsed == nullptr) {
    *why = std::string("JSON not storable as BSON: ") + err.message;
    return false;
  }
  bson_iter_t it;
  bool ok = bson_iter_init_find(&it, parsed, "v") && bson_append_value(doc, name, -1, bson_iter_value(&it));
  bson_destroy(parsed);
  if (!ok) *why = "JSON value could not be stored";
  return ok;
}

bool get_string(const bson_t* doc, const char* name, std::string* out) {
  bson_iter_t it;
  if (!bson_iter_init_find(&it, doc, name) || !BSON_ITER_HOLDS_UTF8(&it)) return false;
  uint32_t len = 0;
  const char* s = bson_iter_utf8(&it, &len);
  out->assign(s, len);
  return true;
}

bool get_int64(const bson_t* doc, const char* name, int64_t* out) {
  bson_iter_t it;
  if (!bson_iter_init_find(&it, doc, name)) return false;
  if (BSON_ITER_HOLDS_INT32(&it)) {
    *out = bson_iter_int32(&it);
    return true;
  }
  if (BSON_ITER_HOLDS_INT64(&it)) {
    *out = bson_iter_int64(&it);
    return true;
  }
  if (BSON_ITER_HOLDS_DOUBLE(&it)) {
    double d = bson_iter_double(&it);
    if (std::isfinite(d) && std::floor(d) == d && std::fabs(d) < 9.0e15) {
      *out = static_cast<int64_t>(d);
      return true;
    }
  }
  return false;
}

bool get_date_ms(const bson_t* doc, const char* name, int64_t* out) {
  bson_iter_t it;
  if (!bson_iter_init_find(&it, doc, name) || !BSON_ITER_HOLDS_DATE_TIME(&it)) return false;
  *out = bson_iter_date_time(&it);
  return true;
}

void pause_point(const char* point, const std::string& detail) {
  static const char* want = getenv("RELAYBUS_MONGO_PAUSE_POINT");
  if (want == nullptr || strcmp(want, point) != 0) return;
  const char* at = getenv("RELAYBUS_MONGO_PAUSE_AT");
  if (at != nullptr && detail != at) return;
  const char* armed = getenv("RELAYBUS_MONGO_PAUSE_FILE");
  if (armed != nullptr && unlink(armed) != 0) return;  // not armed (again) by the test
  const char* ms = getenv("RELAYBUS_MONGO_PAUSE_MS");
  const int64_t n = ms != nullptr ? atoll(ms) : 1000;
  log_warn("test pause point reached: sleeping", {{"point", point}, {"at", detail}, {"ms", n}});
  usleep(static_cast<useconds_t>(n) * 1000);
}

void crash_point(const char* point) {
  static const char* want = getenv("RELAYBUS_MONGO_CRASH_POINT");
  if (want != nullptr && strcmp(want, point) == 0) {
    log_warn("test crash point reached: exiting", {{"point", point}});
    _exit(99);
  }
}

}  // namespace relaybus::mongo
