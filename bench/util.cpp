#include "util.hpp"

#include <cstdarg>
#include <fstream>
#include <sstream>
#include <sys/wait.h>

namespace bench {

std::string strf(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char buf[1024];
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n < int(sizeof buf)) {
    va_end(ap2);
    return std::string(buf, n > 0 ? n : 0);
  }
  std::string out(size_t(n) + 1, '\0');
  vsnprintf(&out[0], out.size(), fmt, ap2);
  va_end(ap2);
  out.resize(size_t(n));
  return out;
}

double cpu_spin_ms() {
  volatile uint64_t sink = 0;
  uint64_t x = 88172645463325252ull;
  int64_t t0 = mono_ns();
  for (int i = 0; i < 60000000; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    sink += x & 0xff;
  }
  (void)sink;
  return double(mono_ns() - t0) / 1e6;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return std::string();
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw std::runtime_error("cannot write " + path);
  f << text;
}

void append_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::app);
  if (!f) throw std::runtime_error("cannot append to " + path);
  f << text;
}

std::string run_capture(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    if (status) *status = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int st = pclose(p);
  if (status) *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return std::string();
  size_t b = s.find_last_not_of(" \t\r\n");
  return s.substr(a, b - a + 1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

std::string utc_stamp(bool compact) {
  time_t t = time(nullptr);
  tm g;
  gmtime_r(&t, &g);
  char buf[64];
  strftime(buf, sizeof buf, compact ? "%Y%m%dT%H%M%SZ" : "%Y-%m-%dT%H:%M:%SZ", &g);
  return buf;
}

double median(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return !std::isfinite(x); }), v.end());
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string json_escape(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        o += "\\\"";
        break;
      case '\\':
        o += "\\\\";
        break;
      case '\n':
        o += "\\n";
        break;
      case '\r':
        o += "\\r";
        break;
      case '\t':
        o += "\\t";
        break;
      default:
        if (c < 0x20)
          o += strf("\\u%04x", c);
        else
          o += char(c);
    }
  }
  return o + "\"";
}

std::string Json::dump() const {
  switch (t_) {
    case Null:
      return "null";
    case Bool:
      return b_ ? "true" : "false";
    case Int:
      return std::to_string(i_);
    case Num: {
      if (d_ == std::floor(d_) && std::fabs(d_) < 1e15) return strf("%.1f", d_);
      return strf("%.6g", d_);
    }
    case Str:
      return json_escape(s_);
    case Arr: {
      std::string o = "[";
      for (size_t i = 0; i < arr_.size(); i++) o += (i ? ", " : "") + arr_[i].dump();
      return o + "]";
    }
    case Obj: {
      std::string o = "{";
      for (size_t i = 0; i < obj_.size(); i++)
        o += (i ? ", " : "") + json_escape(obj_[i].first) + ": " + obj_[i].second.dump();
      return o + "}";
    }
  }
  return "null";
}

std::string num(double v, int prec) {
  if (!std::isfinite(v)) return "–";
  if (prec == 0) {
    long long x = llround(v);
    std::string s = std::to_string(x < 0 ? -x : x), o;
    for (size_t i = 0; i < s.size(); i++) {
      if (i && (s.size() - i) % 3 == 0) o += ',';
      o += s[i];
    }
    return (x < 0 ? "-" : "") + o;
  }
  return strf("%.*f", prec, v);
}

}  // namespace bench
