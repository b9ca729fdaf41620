// Small helpers of the benchmark harness: clocks, strings, a JSON writer,
// percentiles, files. No PostgreSQL headers here.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace bench {

inline int64_t mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

inline int64_t real_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

inline void sleep_until_mono(int64_t t) {
  timespec ts;
  ts.tv_sec = t / 1000000000;
  ts.tv_nsec = t % 1000000000;
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) != 0) {
  }
}

inline void sleep_ms(int64_t ms) { sleep_until_mono(mono_ns() + ms * 1000000); }

std::string strf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// A number for the reports: "1,234" (prec 0, thousands separators) or fixed decimals; "–" if not finite.
std::string num(double v, int prec = 0);

// A fixed CPU spin; returns its duration in milliseconds. Timed before each
// sample so a busy machine shows up in the sample instead of in the ratio.
double cpu_spin_ms();

std::string read_file(const std::string& path);
void write_file(const std::string& path, const std::string& text);
void append_file(const std::string& path, const std::string& text);
std::string run_capture(const std::string& cmd, int* status = nullptr);
std::string trim(const std::string& s);
std::vector<std::string> split(const std::string& s, char sep);
bool starts_with(const std::string& s, const std::string& p);
std::string utc_stamp(bool compact);

// Percentile (0..100) of a sorted vector, nearest rank.
template <class T>
double percentile_sorted(const std::vector<T>& v, double p) {
  if (v.empty()) return NAN;
  size_t rank = size_t(std::ceil(p / 100.0 * double(v.size())));
  if (rank < 1) rank = 1;
  if (rank > v.size()) rank = v.size();
  return double(v[rank - 1]);
}

double median(std::vector<double> v);

// A minimal JSON value builder that keeps insertion order.
class Json {
 public:
  enum Type { Null, Bool, Num, Int, Str, Arr, Obj };
  Json() : t_(Null) {}
  Json(std::nullptr_t) : t_(Null) {}
  Json(bool b) : t_(Bool), b_(b) {}
  Json(int v) : t_(Int), i_(v) {}
  Json(long v) : t_(Int), i_(v) {}
  Json(long long v) : t_(Int), i_(v) {}
  Json(unsigned v) : t_(Int), i_(v) {}
  Json(unsigned long v) : t_(Int), i_(int64_t(v)) {}
  Json(double v) : t_(std::isfinite(v) ? Num : Null), d_(v) {}
  Json(const char* s) : t_(Str), s_(s) {}
  Json(const std::string& s) : t_(Str), s_(s) {}
  static Json array() {
    Json j;
    j.t_ = Arr;
    return j;
  }
  static Json object() {
    Json j;
    j.t_ = Obj;
    return j;
  }
  Json& operator[](const std::string& k) {
    if (t_ == Null) t_ = Obj;
    for (auto& kv : obj_)
      if (kv.first == k) return kv.second;
    obj_.emplace_back(k, Json());
    return obj_.back().second;
  }
  const Json* find(const std::string& k) const {
    for (auto& kv : obj_)
      if (kv.first == k) return &kv.second;
    return nullptr;
  }
  void push(const Json& v) {
    if (t_ == Null) t_ = Arr;
    arr_.push_back(v);
  }
  Type type() const { return t_; }
  double num() const { return t_ == Int ? double(i_) : (t_ == Num ? d_ : NAN); }
  const std::string& str() const { return s_; }
  std::string dump() const;

 private:
  Type t_;
  bool b_ = false;
  int64_t i_ = 0;
  double d_ = 0;
  std::string s_;
  std::vector<Json> arr_;
  std::vector<std::pair<std::string, Json>> obj_;
};

std::string json_escape(const std::string& s);

}  // namespace bench
