// The bodies of the child processes: publishers, pull consumers, floor takers,
// LISTEN clients and notify senders. Each is its own process with its own
// connection; it reports through files in its sample directory:
//   <label>.out   key=value counters (ChildOut)
//   <label>.rcpt  Receipt records (consumers)
//   <label>.pub   PubRec records (publishers of mixed cells)
// An External child runs a program (a peer's own worker, e.g. graphile-worker's
// Node runner) under the same contract; see run_external().

#include "children.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <random>
#include <unordered_map>

#include "pg.hpp"

namespace bench {

static volatile sig_atomic_t g_stop = 0;
static volatile sig_atomic_t g_drain = 0;

static void on_term(int) { g_stop = 1; }
static void on_usr1(int) { g_drain = 1; }

std::string key_text(Keys k, uint32_t r) {
  int n = keys_count(k);
  if (n == 0) return std::string();
  return "k" + std::to_string(r % uint32_t(n));
}

int32_t key_id_of(const char* key) {
  if (key == nullptr || key[0] != 'k') return -1;
  return int32_t(strtol(key + 1, nullptr, 10));
}

// About 100 bytes of JSON, the same shape in every cell and every system.
std::string make_payload(uint64_t order, int64_t t_real_ns) {
  return strf(
      "{\"order\": %llu, \"amount\": 1999, \"cur\": \"EUR\", \"cust\": \"c-123456\", "
      "\"note\": \"abcdefghij\", \"t\": %lld}",
      10000000ull + order % 90000000ull, (long long)t_real_ns);
}

namespace {

struct Counter {
  const Go* go = nullptr;
  ChildOut out;
  std::vector<int64_t> call_ns;  // durations of calls completed in the window
  void done(long long n, int64_t start, int64_t end) {
    out.units_total += n;
    if (end >= go->t0) out.units_since_t0 += n;
    if (end >= go->t0 && end <= go->t1) {
      out.units_window += n;
      out.calls_window++;
      call_ns.push_back(end - start);
    }
  }
  bool in_window(int64_t t) const { return t >= go->t0 && t <= go->t1; }
  // A call that handed over nothing (ended at t).
  void empty(int64_t t) {
    if (in_window(t)) out.empty_in_window++;
  }
  void error(const std::exception& e) {
    out.errors++;
    if (out.first_error.empty()) out.first_error = e.what();
  }
};

// After a failed call: counts it, rolls back an open transaction (in_tx) and
// backs off. False when the connection is gone and the loop should end.
bool recover(Conn& c, Counter& cnt, const PgError& e, bool in_tx) {
  cnt.error(e);
  if (PQstatus(c.raw()) != CONNECTION_OK) return false;
  if (in_tx) {
    try {
      c.exec("ROLLBACK");
    } catch (...) {
    }
  }
  sleep_ms(5);
  return true;
}

class BinWriter {
 public:
  explicit BinWriter(const std::string& path) : f_(fopen(path.c_str(), "wb")) {
    if (f_ == nullptr) throw std::runtime_error("cannot write " + path);
    setvbuf(f_, nullptr, _IOFBF, 1 << 20);
  }
  ~BinWriter() {
    if (f_ != nullptr) fclose(f_);
  }
  template <class T>
  void put(const T& rec) {
    fwrite(&rec, sizeof rec, 1, f_);
  }

 private:
  FILE* f_;
};

void write_out(const ChildSpec& spec, Counter& c) {
  std::sort(c.call_ns.begin(), c.call_ns.end());
  std::string s;
  s += strf("units_window=%lld\n", c.out.units_window);
  s += strf("units_since_t0=%lld\n", c.out.units_since_t0);
  s += strf("units_total=%lld\n", c.out.units_total);
  s += strf("errors=%lld\n", c.out.errors);
  s += strf("empty_in_window=%lld\n", c.out.empty_in_window);
  s += strf("calls_window=%lld\n", c.out.calls_window);
  s += strf("call_p50_us=%.1f\n", percentile_sorted(c.call_ns, 50) / 1000.0);
  s += strf("call_p99_us=%.1f\n", percentile_sorted(c.call_ns, 99) / 1000.0);
  std::string fe = c.out.first_error;
  for (char& ch : fe)
    if (ch == '\n') ch = ' ';
  s += "first_error=" + fe + "\n";
  write_file(spec.dir + "/" + spec.label + ".out", s);
}

// Parses "{1,2,3}" into ids.
void parse_int_array(const char* s, std::vector<int64_t>* out) {
  out->clear();
  const char* p = s;
  while (*p != '\0') {
    if ((*p >= '0' && *p <= '9') || *p == '-') {
      char* end = nullptr;
      out->push_back(strtoll(p, &end, 10));
      p = end;
    } else {
      p++;
    }
  }
}

// ---- publisher ---------------------------------------------------------------

void run_publish(const ChildSpec& spec, Conn& c, const Go& go, Counter& cnt) {
  std::mt19937 rng(spec.seed);
  std::unique_ptr<BinWriter> pubs;
  if (spec.record_pubs) pubs.reset(new BinWriter(spec.dir + "/" + spec.label + ".pub"));
  uint64_t order = uint64_t(spec.seed) * 1000003ull;
  int64_t interval = spec.rate > 0 ? int64_t(1e9 / spec.rate) : 0;
  int64_t next_due = go.t_warm;
  std::vector<int64_t> ids;
  std::string payload, key, parr, karr;
  while (!g_stop) {
    int64_t now = mono_ns();
    if (now >= go.t1) break;
    if (interval > 0) {
      if (next_due > now) {
        sleep_until_mono(std::min(next_due, go.t1));
        if (mono_ns() >= go.t1) break;
      }
      next_due += interval;  // open loop: a late publisher does not skip, it catches up
    }
    std::vector<const char*> params(2, nullptr);
    int64_t t_pay = real_ns();
    if (spec.batch == 1) {
      payload = make_payload(order++, t_pay);
      key = key_text(spec.keys, rng());
      params[0] = payload.c_str();
      params[1] = spec.keys == Keys::None ? nullptr : key.c_str();
    } else {
      parr = "{";
      karr = "{";
      for (int i = 0; i < spec.batch; i++) {
        payload = make_payload(order++, t_pay);
        array_append(&parr, payload.c_str());
        key = key_text(spec.keys, rng());
        array_append(&karr, spec.keys == Keys::None ? nullptr : key.c_str());
      }
      parr += "}";
      karr += "}";
      params[0] = parr.c_str();
      params[1] = karr.c_str();
    }
    int64_t start = mono_ns();
    try {
      Result r = c.exec_prepared("pub", params);
      int64_t end = mono_ns();
      int64_t end_real = real_ns();
      cnt.done(spec.batch, start, end);
      if (pubs && spec.returns_ids && r.rows() > 0) {
        if (spec.batch == 1) {
          pubs->put(PubRec{r.i64(0, 0), end, end_real});
        } else {
          parse_int_array(r.val(0, 0), &ids);
          for (int64_t id : ids) pubs->put(PubRec{id, end, end_real});
        }
      }
    } catch (const PgError& e) {
      if (!recover(c, cnt, e, false)) break;
    }
  }
}

// ---- pull consumer: BEGIN; claim; ack; COMMIT -----------------------------------

void run_claim_ack(const ChildSpec& spec, Conn& c, const Go& go, Counter& cnt) {
  BinWriter rc(spec.dir + "/" + spec.label + ".rcpt");
  std::string ids;
  std::vector<Receipt> got;
  while (!g_stop) {
    int64_t start = mono_ns();
    if (start >= go.t1) break;
    try {
      c.exec("BEGIN");
      Result r = c.exec_prepared("claim", {});
      int64_t t_recv = mono_ns(), t_real = real_ns();
      int n = r.rows();
      if (n == 0) {
        c.exec("COMMIT");
        cnt.empty(t_recv);
        sleep_ms(2);
        continue;
      }
      ids = "{";
      got.clear();
      for (int i = 0; i < n; i++) {
        Receipt x{};
        x.delivery_id = r.i64(i, 0);
        x.event_id = r.i64(i, 1);
        x.key_id = r.null(i, 2) ? -1 : key_id_of(r.val(i, 2));
        x.seq = r.null(i, 3) ? -1 : r.i64(i, 3);
        x.mono_ns = t_recv;
        x.real_ns = t_real;
        x.handler = int16_t(spec.handler_index);
        got.push_back(x);
        if (i) ids += ',';
        ids += r.val(i, 0);
      }
      ids += "}";
      c.exec_prepared("ack", {ids.c_str()});
      c.exec("COMMIT");
      int64_t end = mono_ns();
      for (Receipt& x : got) {
        x.flags = 1;
        rc.put(x);
      }
      cnt.done(n, start, end);
    } catch (const PgError& e) {
      if (!recover(c, cnt, e, true)) break;
    }
  }
}

// ---- take: one statement that hands over and removes rows (the floor) ----------

void run_take(const ChildSpec& spec, Conn& c, const Go& go, Counter& cnt) {
  while (!g_stop) {
    int64_t start = mono_ns();
    if (start >= go.t1) break;
    try {
      Result r = c.exec_prepared("take", {});
      int64_t end = mono_ns();
      int n = r.rows();
      if (n == 0) {
        cnt.empty(end);
        sleep_ms(2);
        continue;
      }
      cnt.done(n, start, end);
    } catch (const PgError& e) {
      if (!recover(c, cnt, e, false)) break;
    }
  }
}

// ---- notify sender (the floor for notify) -------------------------------------

void run_notify_send(const ChildSpec& spec, Conn& c, const Go& go, Counter& cnt) {
  uint64_t next_id = uint64_t(spec.seed) << 32;
  std::string arr, one;
  while (!g_stop) {
    int64_t start = mono_ns();
    if (start >= go.t1) break;
    try {
      long long n;
      if (spec.send_payloads) {
        arr = "{";
        int64_t t = real_ns();
        for (int i = 0; i < spec.batch; i++) {
          unsigned long long id = next_id++;
          one = strf(
                    "{\"id\": %llu, \"key\": null, \"seq\": null, \"topic\": \"bench.e\", \"attempt\": 1, "
                    "\"headers\": null, \"payload\": ",
                    id) +
                make_payload(id, t) + strf(", \"event_id\": %llu}", id);
          array_append(&arr, one.c_str());
        }
        arr += "}";
        c.exec_prepared("send", {arr.c_str()});
        n = spec.batch;
      } else {
        Result r = c.exec_prepared("send", {});
        n = r.rows() > 0 ? r.i64(0, 0) : 0;
      }
      int64_t end = mono_ns();
      if (n == 0) {
        cnt.empty(end);
        sleep_ms(2);
        continue;
      }
      cnt.done(n, start, end);
    } catch (const PgError& e) {
      if (!recover(c, cnt, e, false)) break;
    }
  }
}

// ---- LISTEN client ---------------------------------------------------------------

// Reads the number after `"name": ` (searching from `from`); -1 for null or absent.
int64_t json_int_field(const char* s, const char* name, bool from_end) {
  std::string pat = std::string("\"") + name + "\": ";
  const char* p;
  if (from_end) {
    p = nullptr;
    for (const char* q = strstr(s, pat.c_str()); q != nullptr; q = strstr(q + 1, pat.c_str())) p = q;
  } else {
    p = strstr(s, pat.c_str());
  }
  if (p == nullptr) return -1;
  p += pat.size();
  if (*p == 'n') return -1;
  return strtoll(p, nullptr, 10);
}

// Whether relay_ack takes the messages' leases (0.2.0); a base build of an A/B
// run may predate lease receipts and have relay_ack(ids) only.
bool g_ack_with_leases = true;

// The lease token of an ack-mode message: `"lease": "<uuid>"`, the last field.
std::string json_lease_field(const char* s) {
  const char* p = nullptr;
  for (const char* q = strstr(s, "\"lease\": \""); q != nullptr; q = strstr(q + 1, "\"lease\": \"")) p = q;
  if (p == nullptr) return "";
  p += 10;
  const char* e = strchr(p, '"');
  return e == nullptr ? "" : std::string(p, e);
}

int32_t json_key_field(const char* s) {
  const char* p = strstr(s, "\"key\": ");
  if (p == nullptr) return -1;
  p += 7;
  if (*p != '"') return -1;
  return key_id_of(p + 1);
}

void run_listen(const ChildSpec& spec, Conn& c, int go_fd, Go* go_out, Counter& cnt) {
  BinWriter rc(spec.dir + "/" + spec.label + ".rcpt");
  bool have_go = false;
  Go& go = *go_out;
  go.t0 = go.t1 = INT64_MAX;  // nothing counts in a window before the parent says when it is
  go.t_warm = 0;
  bool ack_mode = !spec.ack_sql.empty();
  std::vector<Receipt> pending;             // ack mode: received, not yet acked
  std::vector<std::string> pending_leases;  // their lease tokens
  std::string ids, leases;
  int64_t last_seen = mono_ns();
  int64_t drain_since = 0;
  int sock = PQsocket(c.raw());

  auto flush_acks = [&]() {
    if (pending.empty()) return;
    ids = "{";
    for (size_t i = 0; i < pending.size(); i++) {
      if (i) ids += ',';
      ids += std::to_string(pending[i].delivery_id);
    }
    ids += "}";
    leases = "{";
    for (size_t i = 0; i < pending_leases.size(); i++) {
      if (i) leases += ',';
      leases += pending_leases[i].empty() ? "NULL" : pending_leases[i];
    }
    leases += "}";
    int64_t start = mono_ns();
    try {
      if (g_ack_with_leases)
        c.exec_prepared("ack", {ids.c_str(), leases.c_str()});
      else
        c.exec_prepared("ack", {ids.c_str()});
      int64_t end = mono_ns();
      for (Receipt& x : pending) {
        x.flags |= 1;
        rc.put(x);
      }
      cnt.done((long long)pending.size(), start, end);
    } catch (const PgError& e) {
      cnt.error(e);
      for (Receipt& x : pending) rc.put(x);  // received, not acked
    }
    pending.clear();
    pending_leases.clear();
  };

  while (!g_stop) {
    pollfd fds[2];
    int nfds = 0;
    fds[nfds++] = pollfd{sock, POLLIN, 0};
    if (!have_go) fds[nfds++] = pollfd{go_fd, POLLIN, 0};
    int timeout = ack_mode && !pending.empty() ? 0 : 20;
    int rv = poll(fds, nfds, timeout);
    if (rv < 0 && errno != EINTR) break;
    if (!have_go && nfds > 1 && (fds[1].revents & (POLLIN | POLLHUP))) {
      if (read(go_fd, &go, sizeof go) == sizeof go)
        have_go = true;
      else
        break;
      cnt.go = &go;
    }
    if (PQconsumeInput(c.raw()) == 0) {
      cnt.error(std::runtime_error(PQerrorMessage(c.raw())));
      break;
    }
    int got_now = 0;
    while (PGnotify* n = PQnotifies(c.raw())) {
      int64_t tm = mono_ns(), tr = real_ns();
      Receipt x{};
      x.delivery_id = json_int_field(n->extra, "id", false);
      x.event_id = json_int_field(n->extra, "event_id", true);
      x.seq = json_int_field(n->extra, "seq", false);
      x.key_id = json_key_field(n->extra);
      x.mono_ns = tm;
      x.real_ns = tr;
      x.handler = int16_t(spec.handler_index);
      for (size_t i = 0; i < spec.channels.size(); i++)
        if (spec.channels[i] == n->relname) x.handler = int16_t(spec.handler_index + int(i));
      if (x.delivery_id < 0 || x.event_id < 0) x.flags |= 2;
      std::string lease = ack_mode ? json_lease_field(n->extra) : std::string();
      PQfreemem(n);
      got_now++;
      if (ack_mode) {
        pending.push_back(x);
        pending_leases.push_back(std::move(lease));
        if ((int)pending.size() >= spec.ack_batch) flush_acks();
      } else {
        rc.put(x);
        cnt.done(1, tm, tm);
      }
    }
    int64_t now = mono_ns();
    if (got_now > 0) last_seen = now;
    if (ack_mode && !pending.empty() && got_now == 0) flush_acks();  // nothing more queued: ack what we have
    if (g_drain) {
      if (drain_since == 0) drain_since = now;
      // The dispatchers are stopped: everything they committed is queued for us.
      if (now - last_seen > 300000000LL && now - drain_since > 300000000LL && pending.empty()) break;
      if (now - drain_since > 30000000000LL) break;  // safety
    }
    if (have_go && go.t1 != INT64_MAX && now > go.t1 + 120000000000LL) break;  // safety
  }
  flush_acks();
}

// ---- PgQ consumer: BEGIN; next_batch; get_batch_events; finish_batch; COMMIT ------

void run_pgq_batch(const ChildSpec& spec, Conn& c, const Go& go, Counter& cnt) {
  BinWriter rc(spec.dir + "/" + spec.label + ".rcpt");
  std::vector<Receipt> got;
  while (!g_stop) {
    int64_t start = mono_ns();
    if (start >= go.t1) break;
    try {
      c.exec("BEGIN");
      Result b = c.exec_prepared("batch", {});
      if (b.rows() == 0 || b.null(0, 0)) {  // no tick ahead of this consumer yet
        c.exec("COMMIT");
        cnt.empty(mono_ns());
        sleep_ms(2);
        continue;
      }
      std::string batch_id = b.str(0, 0);
      Result r = c.exec_prepared("events", {batch_id.c_str()});
      int64_t t_recv = mono_ns(), t_real = real_ns();
      got.clear();
      for (int i = 0; i < r.rows(); i++) {
        Receipt x{};
        x.event_id = r.i64(i, 0);
        x.delivery_id = x.event_id;
        x.key_id = r.null(i, 1) ? -1 : key_id_of(r.val(i, 1));
        x.seq = -1;  // PgQ keeps no per-key order: nothing to check
        x.mono_ns = t_recv;
        x.real_ns = t_real;
        x.handler = int16_t(spec.handler_index);
        got.push_back(x);
      }
      c.exec_prepared("finish", {batch_id.c_str()});
      c.exec("COMMIT");
      int64_t end = mono_ns();
      for (Receipt& x : got) {
        x.flags = 1;  // finished batch: acknowledged
        rc.put(x);
      }
      if (got.empty()) {
        cnt.empty(end);
        continue;
      }
      cnt.done((long long)got.size(), start, end);
    } catch (const PgError& e) {
      if (!recover(c, cnt, e, true)) break;
    }
  }
}

// ---- External: a peer's own worker program ---------------------------------------
//
// The program gets the environment in spec.env plus BENCH_OUT (<label>.out) and
// BENCH_RCPT (<label>.rcpt). It prints "ready" on stdout once connected, reads
// "go <t_warm> <t0> <t1>" (CLOCK_MONOTONIC ns) on stdin, works from t_warm, counts
// units inside [t0, t1] itself, stops at t1 on its own, writes <label>.out in the
// ChildOut key=value format (and receipts as Receipt records) and exits 0.
// With reports_units false (a helper daemon such as pgqd) the program only has to
// run: it is ready once started, gets SIGTERM at t1, and this process writes the
// .out file (no units; a non-zero exit before t1 is an error).

pid_t g_program = -1;
void on_term_forward(int) {
  g_stop = 1;
  if (g_program > 0) kill(g_program, SIGTERM);
}

pid_t start_program(const ChildSpec& spec, int* to_child, int* from_child) {
  int in[2], out[2];
  if (pipe(in) != 0 || pipe(out) != 0) throw std::runtime_error("pipe failed");
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // kept across exec: never outlives the harness's child
    dup2(in[0], 0);
    dup2(out[1], 1);
    // Its log goes beside its counters (pgqd logs every start and stop to stderr too).
    int err = open((spec.dir + "/" + spec.label + ".stderr").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (err >= 0) {
      dup2(err, 2);
      close(err);
    }
    close(in[0]);
    close(in[1]);
    close(out[0]);
    close(out[1]);
    for (const std::string& kv : spec.env) putenv(strdup(kv.c_str()));
    setenv("BENCH_OUT", (spec.dir + "/" + spec.label + ".out").c_str(), 1);
    setenv("BENCH_RCPT", (spec.dir + "/" + spec.label + ".rcpt").c_str(), 1);
    std::vector<char*> args;
    for (const std::string& a : spec.argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    fprintf(stderr, "exec %s: %s\n", args[0], strerror(errno));
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  *to_child = in[1];
  *from_child = out[0];
  return pid;
}

// Reads one line from fd within timeout_ms ("" on timeout or EOF).
std::string read_line(int fd, int timeout_ms) {
  std::string line;
  int64_t deadline = mono_ns() + int64_t(timeout_ms) * 1000000;
  char ch;
  while (mono_ns() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    ssize_t n = read(fd, &ch, 1);
    if (n <= 0) return std::string();
    if (ch == '\n') return line;
    line += ch;
  }
  return std::string();
}

// How the program ended, with the end of its stderr.
std::string exit_text(const ChildSpec& spec, int st) {
  std::string s = WIFEXITED(st) ? strf("exit status %d", WEXITSTATUS(st))
                                : (WIFSIGNALED(st) ? strf("killed by signal %d", WTERMSIG(st)) : "ended");
  std::string err = read_file(spec.dir + "/" + spec.label + ".stderr");
  if (err.size() > 400) err = err.substr(err.size() - 400);
  return err.empty() ? s : s + "; stderr: " + trim(err);
}

[[noreturn]] void run_external(const ChildSpec& spec, int ready_fd, int go_fd) {
  signal(SIGTERM, on_term_forward);
  int to_child = -1, from_child = -1;
  std::string err;
  try {
    g_program = start_program(spec, &to_child, &from_child);
  } catch (const std::exception& e) {
    err = e.what();
  }
  if (err.empty()) {
    if (spec.reports_units) {
      std::string line = read_line(from_child, 55000);
      if (trim(line) != "ready") {
        kill(g_program, SIGKILL);
        int st = 0;
        waitpid(g_program, &st, 0);
        g_program = -1;
        err = spec.argv[0] + " did not report ready (got '" + line + "', " + exit_text(spec, st) + ")";
      }
    } else {
      sleep_ms(300);  // a daemon that fails its configuration exits at once
      int st;
      if (waitpid(g_program, &st, WNOHANG) == g_program) {
        err = spec.argv[0] + " ended at start: " + exit_text(spec, st);
        g_program = -1;
      }
    }
  }
  if (!err.empty()) {
    if (g_program > 0) kill(g_program, SIGKILL);
    std::string m = "e" + err;
    (void)!write(ready_fd, m.data(), m.size());
    _exit(2);
  }
  (void)!write(ready_fd, "r0", 2);  // no backend of our own to cancel
  close(ready_fd);
  Go go;
  if (read(go_fd, &go, sizeof go) != sizeof go) {
    kill(g_program, SIGKILL);
    _exit(3);
  }
  Counter cnt;
  cnt.go = &go;
  int st = 0;
  if (spec.reports_units) {
    std::string line = strf("go %lld %lld %lld\n", (long long)go.t_warm, (long long)go.t0, (long long)go.t1);
    (void)!write(to_child, line.data(), line.size());
    close(to_child);
    waitpid(g_program, &st, 0);
    // The program writes its own .out; a missing one means it failed before writing it.
    if (read_file(spec.dir + "/" + spec.label + ".out").empty()) {
      cnt.error(std::runtime_error(spec.argv[0] + " wrote no counters (" + exit_text(spec, st) + ")"));
      write_out(spec, cnt);
    }
    _exit(0);
  }
  // A helper daemon: runs until t1, then SIGTERM.
  bool died = false;
  while (mono_ns() < go.t1 && !g_stop) {
    if (waitpid(g_program, &st, WNOHANG) == g_program) {
      died = true;
      break;
    }
    sleep_ms(20);
  }
  if (!died) {
    kill(g_program, SIGTERM);
    waitpid(g_program, &st, 0);
  } else {
    cnt.error(std::runtime_error(spec.argv[0] + " ended during the sample: " + exit_text(spec, st)));
  }
  write_out(spec, cnt);
  _exit(0);
}

// What one preloaded delivery is, for receipts from the receiver's log.
struct DeliveryInfo {
  int64_t event_id;
  int64_t seq;
  int32_t key_id;
  int16_t handler;
};

// HttpLog: waits for the parent's SIGUSR1 (delivery stopped), has nginx write
// its log buffers out, then turns every logged request into a counted unit and
// (with a delivery map) a receipt. Line order is serving order (one nginx worker).
void run_http_log(const ChildSpec& spec, const std::unordered_map<int64_t, DeliveryInfo>& map, int go_fd, Go* go_out,
                  Counter& cnt) {
  Go& go = *go_out;
  if (read(go_fd, &go, sizeof go) != sizeof go) _exit(3);
  // $msec is CLOCK_REALTIME; the window is CLOCK_MONOTONIC.
  int64_t real_minus_mono = real_ns() - mono_ns();
  while (!g_drain && !g_stop && mono_ns() < go.t1 + 120000000000LL) sleep_ms(20);
  if (spec.nginx_pid > 0) kill(spec.nginx_pid, SIGUSR1);
  sleep_ms(400);
  std::ifstream in(spec.http_log);
  if (!in) throw std::runtime_error("cannot read " + spec.http_log);
  BinWriter rc(spec.dir + "/" + spec.label + ".rcpt");
  std::string line;
  long long not_200 = 0;
  while (std::getline(in, line)) {
    // "<sec>.<ms> <webhook-id> <status>"; the webhook-id is
    // msg_<system id>_<database oid>_<delivery id> (docs/webhooks.md).
    char* end = nullptr;
    double msec = strtod(line.c_str(), &end);
    if (end == line.c_str()) continue;
    while (*end == ' ') end++;
    const char* token = end;
    while (*end != '\0' && *end != ' ') end++;
    const char* digits = token;
    for (const char* q = token; q < end; q++)
      if (*q == '_') digits = q + 1;
    long long id = strtoll(digits, nullptr, 10);
    int status = int(strtol(end, nullptr, 10));
    if (status != 200) {
      not_200++;
      continue;
    }
    int64_t t = int64_t(msec * 1e9) - real_minus_mono;
    cnt.done(1, t, t);
    if (map.empty()) continue;
    Receipt r{};
    r.delivery_id = id;
    r.mono_ns = t;
    r.real_ns = int64_t(msec * 1e9);
    auto it = map.find(id);
    if (it == map.end()) {
      r.event_id = -1;
      r.seq = -1;
      r.key_id = -1;
      r.flags = 2;  // not a delivery of this sample
    } else {
      r.event_id = it->second.event_id;
      r.seq = it->second.seq;
      r.key_id = it->second.key_id;
      r.handler = it->second.handler;
    }
    rc.put(r);
  }
  if (not_200 > 0) cnt.error(std::runtime_error(strf("%lld requests answered with a status other than 200", not_200)));
}

// Exec: runs spec.argv from warm-up start until the window's end.
void run_exec(const ChildSpec& spec, const Go& go) {
  long secs = long((go.t1 - mono_ns() + 999999999) / 1000000000);
  std::vector<std::string> args;
  for (std::string a : spec.argv) {
    size_t p = a.find("{secs}");
    if (p != std::string::npos) a.replace(p, 6, std::to_string(std::max(1L, secs)));
    args.push_back(a);
  }
  std::string cmd;
  for (const std::string& a : args) cmd += "'" + a + "' ";
  int st = 0;
  std::string out = run_capture(cmd + "2>&1", &st);
  write_file(spec.dir + "/" + spec.label + ".log", out);
  if (st != 0) throw std::runtime_error("exited with status " + std::to_string(st) + ": " + out.substr(0, 300));
}

}  // namespace

int child_main(const ChildSpec& spec, int ready_fd, int go_fd) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  signal(SIGTERM, on_term);
  signal(SIGUSR1, on_usr1);
  signal(SIGPIPE, SIG_IGN);
  if (spec.role == Role::External) run_external(spec, ready_fd, go_fd);
  Counter cnt;
  Go go;
  cnt.go = &go;
  Conn c;
  std::unordered_map<int64_t, DeliveryInfo> delivery_map;
  try {
    c.connect(spec.conninfo);
    switch (spec.role) {
      case Role::Publish:
        c.prepare("pub", spec.sql, 2);
        break;
      case Role::ClaimAck:
        c.prepare("claim", spec.claim_sql, 0);
        c.prepare("ack", spec.ack_sql, 1);
        break;
      case Role::Take:
        c.prepare("take", spec.sql, 0);
        break;
      case Role::NotifySend:
        c.prepare("send", spec.sql, spec.send_payloads ? 1 : 0);
        break;
      case Role::PgqBatch:
        c.prepare("batch", spec.batch_sql, 0);
        c.prepare("events", spec.events_sql, 1);
        c.prepare("finish", spec.finish_sql, 1);
        break;
      case Role::External:
        break;  // handled above
      case Role::Listen:
        for (const std::string& ch : spec.channels) c.exec("LISTEN " + ch);
        if (!spec.ack_sql.empty()) {
          Result r = c.exec("SELECT to_regprocedure('relay_ack(bigint[],uuid[])') IS NOT NULL");
          g_ack_with_leases = r.str(0, 0) == "t";
          c.prepare("ack", g_ack_with_leases ? spec.ack_sql : "SELECT relay_ack($1::bigint[])",
                    g_ack_with_leases ? 2 : 1);
        }
        break;
      case Role::HttpLog:
        if (!spec.map_sql.empty()) {
          Result r = c.exec(spec.map_sql);
          delivery_map.reserve(size_t(r.rows()) * 2);
          for (int i = 0; i < r.rows(); i++) {
            const std::string h = r.str(i, 4);
            size_t hp = h.rfind('h');
            delivery_map[r.i64(i, 0)] =
                DeliveryInfo{r.i64(i, 1), r.null(i, 3) ? -1 : r.i64(i, 3), r.null(i, 2) ? -1 : key_id_of(r.val(i, 2)),
                             int16_t(hp == std::string::npos ? 0 : atoi(h.c_str() + hp + 1))};
          }
        }
        break;
      case Role::Exec:
        break;
    }
  } catch (const std::exception& e) {
    std::string m = std::string("e") + e.what();
    (void)!write(ready_fd, m.data(), m.size());
    _exit(2);
  }
  std::string ready = "r" + std::to_string(c.backend_pid());  // the parent cancels it if it must kill us
  (void)!write(ready_fd, ready.data(), ready.size());
  close(ready_fd);
  try {
    if (spec.role == Role::Listen) {
      run_listen(spec, c, go_fd, &go, cnt);
    } else if (spec.role == Role::HttpLog) {
      c.close();
      run_http_log(spec, delivery_map, go_fd, &go, cnt);
    } else {
      if (read(go_fd, &go, sizeof go) != sizeof go) _exit(3);
      if (go.t_warm > mono_ns()) sleep_until_mono(go.t_warm);
      switch (spec.role) {
        case Role::Publish:
          run_publish(spec, c, go, cnt);
          break;
        case Role::ClaimAck:
          run_claim_ack(spec, c, go, cnt);
          break;
        case Role::Take:
          run_take(spec, c, go, cnt);
          break;
        case Role::NotifySend:
          run_notify_send(spec, c, go, cnt);
          break;
        case Role::PgqBatch:
          run_pgq_batch(spec, c, go, cnt);
          break;

        case Role::Exec:
          run_exec(spec, go);
          break;
        default:
          break;
      }
    }
  } catch (const std::exception& e) {
    cnt.error(e);
  }
  c.close();  // the backend exits and flushes its statistics
  write_out(spec, cnt);
  _exit(0);
}

ChildOut read_child_out(const std::string& dir, const std::string& label) {
  ChildOut o;
  o.label = label;
  std::string text = read_file(dir + "/" + label + ".out");
  if (text.empty()) return o;
  o.ok = true;
  for (const std::string& line : split(text, '\n')) {
    size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string k = line.substr(0, eq), v = line.substr(eq + 1);
    auto num = [&]() { return v.empty() ? 0LL : std::stoll(v); };
    auto dbl = [&]() { return v.empty() || v == "nan" ? NAN : std::stod(v); };
    if (k == "units_window")
      o.units_window = num();
    else if (k == "units_since_t0")
      o.units_since_t0 = num();
    else if (k == "units_total")
      o.units_total = num();
    else if (k == "errors")
      o.errors = num();
    else if (k == "empty_in_window")
      o.empty_in_window = num();
    else if (k == "calls_window")
      o.calls_window = num();
    else if (k == "call_p50_us")
      o.call_p50_us = dbl();
    else if (k == "call_p99_us")
      o.call_p99_us = dbl();
    else if (k == "first_error")
      o.first_error = v;
  }
  return o;
}

template <class T>
static std::vector<T> read_records(const std::string& path) {
  std::vector<T> out;
  std::string data = read_file(path);
  out.resize(data.size() / sizeof(T));
  if (!out.empty()) memcpy(out.data(), data.data(), out.size() * sizeof(T));
  return out;
}

std::vector<Receipt> read_receipts(const std::string& dir, const std::string& label) {
  return read_records<Receipt>(dir + "/" + label + ".rcpt");
}

std::vector<PubRec> read_pubs(const std::string& dir, const std::string& label) {
  return read_records<PubRec>(dir + "/" + label + ".pub");
}

}  // namespace bench
