// Small helpers of the sidecar: structured JSON log lines on stderr, clocks,
// and the conversions between JSON text and BSON values.
#pragma once

#include <bson/bson.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

namespace relaybus::mongo {

enum class LogLevel { Debug = 0, Info = 1, Warn = 2, Error = 3 };
bool parse_log_level(std::string_view text, LogLevel* out);
void set_log_level(LogLevel level);
// One line: {"ts":"2024-01-02T03:04:05.678Z","level":"info","msg":...,<fields>}
void log(LogLevel level, std::string_view msg, nlohmann::json fields = nlohmann::json::object());
inline void log_info(std::string_view msg, nlohmann::json f = nlohmann::json::object()) {
  log(LogLevel::Info, msg, std::move(f));
}
inline void log_warn(std::string_view msg, nlohmann::json f = nlohmann::json::object()) {
  log(LogLevel::Warn, msg, std::move(f));
}
inline void log_error(std::string_view msg, nlohmann::json f = nlohmann::json::object()) {
  log(LogLevel::Error, msg, std::move(f));
}
inline void log_debug(std::string_view msg, nlohmann::json f = nlohmann::json::object()) {
  log(LogLevel::Debug, msg, std::move(f));
}

// A test hook: RELAYBUS_MONGO_CRASH_POINT=<point> makes the process _exit(99)
// when it reaches that point: after a step of applying a sequencer version
// (after_version, after_key_seqs, after_deliveries, after_outbox), or between
// the segments of one completion batch (between_segment_completes).
void crash_point(const char* point);
// Tests only: with RELAYBUS_MONGO_PAUSE_POINT=<point> the process logs "test
// pause point reached" (with `detail`) and sleeps RELAYBUS_MONGO_PAUSE_MS
// (default 1000) there, so a test can act at a known moment in between; with
// RELAYBUS_MONGO_PAUSE_AT only where `detail` is that, and with
// RELAYBUS_MONGO_PAUSE_FILE only when that file exists (it is removed: one
// pause per file the test creates). Points: after_segment_read (detail: the
// collection read by a window), before_deliveries (the sequencer, a version
// committed and its deliveries not inserted yet; detail: the version).
void pause_point(const char* point, const std::string& detail);

int64_t wall_ms();       // milliseconds since the Unix epoch
int64_t monotonic_ms();  // for intervals
std::string iso8601_ms(int64_t epoch_ms);

// Owning bson_t.
class Bson {
 public:
  Bson() { bson_init(&b_); }
  ~Bson() { bson_destroy(&b_); }
  Bson(const Bson&) = delete;
  Bson& operator=(const Bson&) = delete;
  bson_t* get() { return &b_; }
  const bson_t* get() const { return &b_; }
  operator bson_t*() { return &b_; }
  operator const bson_t*() const { return &b_; }

 private:
  bson_t b_;
};

// JSON text of a BSON value in relaxed extended JSON (plain numbers, strings,
// objects, arrays; ObjectIds and dates as {"$oid"}/{"$date"}).
std::string bson_value_to_json(const bson_value_t* value);

// Parses JSON text (any JSON value) and appends it to doc as field `name`.
// false with *why ("invalid JSON at byte 7: ...") if the text is not JSON or
// libbson refuses it (e.g. an object key starting with '$').
bool append_json_value(bson_t* doc, const char* name, std::string_view json_text, std::string* why);

// Field readers: false if absent or of another type (integers accept int32 and
// int64, and doubles with an integral value).
bool get_string(const bson_t* doc, const char* name, std::string* out);
bool get_int64(const bson_t* doc, const char* name, int64_t* out);
bool get_date_ms(const bson_t* doc, const char* name, int64_t* out);
// Every embedded document of doc's field `name`, when that field is of type
// `container` (BSON_TYPE_ARRAY or BSON_TYPE_DOCUMENT), to f(key, document);
// elements that are not documents are skipped.
template <typename F>
void each_embedded(const bson_t* doc, const char* name, bson_type_t container, F&& f) {
  bson_iter_t it, sub;
  if (!bson_iter_init_find(&it, doc, name) || bson_iter_type(&it) != container || !bson_iter_recurse(&it, &sub)) return;
  while (bson_iter_next(&sub)) {
    if (!BSON_ITER_HOLDS_DOCUMENT(&sub)) continue;
    uint32_t len;
    const uint8_t* data;
    bson_iter_document(&sub, &len, &data);
    bson_t e;
    if (bson_init_static(&e, data, len)) f(bson_iter_key(&sub), &e);
  }
}

}  // namespace relaybus::mongo
