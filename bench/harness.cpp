// relaybus-bench: the benchmark harness.
//
// One run = one build (the PostgreSQL install tree that PG_CONFIG points at,
// with relaybus installed in it) x a list of cells. It starts a throwaway
// cluster with durable settings (test/cluster.sh), then for every sample:
// prepares the system, preloads a backlog (dispatch cells), checkpoints, times
// a CPU spin, forks the publisher/consumer processes, runs a warm-up and a
// fixed window (statistics reset at the window's start), stops, reads the
// counters and checks exactness. Results go to bench/results/<UTC stamp>/.
//
// A/B (--base REF --candidate REF): two git refs built into two install trees
// (scripts/pg-tree.sh), one cluster each, only one running at a time; every
// cell's samples interleave the two builds in ABBA order (run_ab below, the
// statistics and the gate in ab.cpp).

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "ab.hpp"
#include "cells.hpp"
#include "children.hpp"
#include "pg.hpp"
#include "receiver.hpp"
#include "report.hpp"
#include "systems.hpp"

using namespace bench;

namespace {

struct Options {
  bool quick = false;
  bool full_matrix = false;
  bool list = false;
  bool keep_cluster = false;
  bool keep_tmp = false;
  bool inject_loss = false;
  bool no_floors = false;
  bool retry_drained = true;
  bool no_peers = false;
  std::string cells;
  std::string out;
  std::string pg_config;  // empty: scripts/pg-config.sh's choice (PG_CONFIG, PG=NN, the Debian release's major)
  std::string repo;
  int samples = 1;
  // A/B mode
  std::string base, candidate;
  bool gate = false;
  bool keep_trees = false;
  int pairs = 3;
  double warmup_s = -1, window_s = -1;  // overrides
  std::string argv_text;
};

// Durable settings of the benchmark cluster (cluster.sh adds fsync = on).
const char* kClusterConf =
    "synchronous_commit = on\n"
    "full_page_writes = on\n"
    "shared_buffers = 1GB\n"
    "max_wal_size = 4GB\n"
    "checkpoint_timeout = 30min\n"
    "pg_stat_statements.track = all\n"
    "pg_stat_statements.max = 10000\n"
    "max_connections = 200\n"
    "log_min_messages = warning\n";

std::string g_repo;
std::vector<pid_t> g_children;
// Clusters to destroy on exit or interrupt: data directory -> the pg_config of its tree.
std::map<std::string, std::string> g_clusters;

// test/cluster.sh VERB DIR with the binaries of the tree that pg_config belongs to.
std::string cluster_cmd(const std::string& pg_config, const std::string& verb, const std::string& dir) {
  return "PG_CONFIG='" + pg_config + "' bash " + g_repo + "/test/cluster.sh " + verb + " " + dir;
}

void destroy_cluster_now(const std::string& dir) {
  auto it = g_clusters.find(dir);
  if (it == g_clusters.end()) return;
  std::string cmd = cluster_cmd(it->second, "destroy", dir) + " >/dev/null 2>&1";
  (void)!system(cmd.c_str());
  g_clusters.erase(it);
}

void on_interrupt(int sig) {
  for (pid_t p : g_children) kill(p, SIGKILL);
  stop_http_receiver();
  // Not async-signal-safe, but we are about to exit and the clusters must not stay behind.
  while (!g_clusters.empty()) destroy_cluster_now(g_clusters.begin()->first);
  _exit(128 + sig);
}

std::string sanitize(const std::string& s) {
  std::string o;
  for (char c : s) o += (isalnum((unsigned char)c) || c == '.' || c == '-') ? c : '_';
  return o;
}

void mkdirs(const std::string& p) {
  std::string cur;
  for (const std::string& part : split(p, '/')) {
    cur += part + "/";
    if (part.empty()) continue;
    mkdir(cur.c_str(), 0755);
  }
}

void rmtree(const std::string& p) {
  if (p.size() < 8) return;
  std::string cmd = "rm -rf '" + p + "'";
  (void)!system(cmd.c_str());
}

struct CpuStat {
  long long busy = 0, total = 0;
};
CpuStat read_cpu() {
  CpuStat c;
  std::string s = read_file("/proc/stat");
  std::vector<std::string> f = split(s.substr(0, s.find('\n')), ' ');
  std::vector<long long> v;
  for (const std::string& x : f)
    if (!x.empty() && isdigit((unsigned char)x[0])) v.push_back(std::stoll(x));
  long long total = 0;
  for (long long x : v) total += x;
  long long idle = (v.size() > 3 ? v[3] : 0) + (v.size() > 4 ? v[4] : 0);
  c.total = total;
  c.busy = total - idle;
  return c;
}

// utime + stime of a process, in seconds.
double proc_cpu_s(int pid) {
  std::string s = read_file("/proc/" + std::to_string(pid) + "/stat");
  size_t p = s.rfind(')');
  if (p == std::string::npos) return NAN;
  std::vector<std::string> f = split(s.substr(p + 2), ' ');
  if (f.size() < 13) return NAN;
  return double(std::stoll(f[11]) + std::stoll(f[12])) / double(sysconf(_SC_CLK_TCK));
}

double loadavg1() {
  std::string s = read_file("/proc/loadavg");
  return s.empty() ? NAN : std::stod(s);
}

std::map<std::string, long long> proc_status_kb(int pid) {
  std::map<std::string, long long> m;
  std::string s = read_file("/proc/" + std::to_string(pid) + "/status");
  for (const std::string& line : split(s, '\n')) {
    for (const char* k : {"VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM"}) {
      std::string key = std::string(k) + ":";
      if (starts_with(line, key)) m[k] = std::stoll(trim(line.substr(key.size())));
    }
  }
  return m;
}

class Runner {
 public:
  // side: "" for a single-build run, "base" / "candidate" in A/B mode (names the
  // per-process directory and the cluster log lines, so the two never mix).
  Runner(const Options& o, const std::string& out_dir, const std::string& pg_config, const std::string& side = "")
      : opt_(o), out_(out_dir), pg_config_(pg_config), side_(side) {
    systems_["relaybus"] = make_relaybus();
    systems_["floor"] = make_floor();
    systems_["pgq"] = make_pgq(out_ + "/tmp/pgqd");
    systems_["graphile"] = make_graphile(o.repo);
    systems_["river"] = make_river(o.repo);
  }

  // River is optional: when its Go program cannot be built (no Go, or the module
  // proxy out of reach), its cells are left out and the report says why.
  std::vector<std::string> skipped_peers;

  // Installs what the selected peers need before the cluster starts: PgQ and pgqd from
  // Debian (scripts/install-deps.sh), graphile-worker from npm (npm ci in bench/graphile),
  // nginx and wrk from Debian for the http cells.
  void ensure_peer_deps(std::vector<Cell>& cells) {
    bool pgq = false, graphile = false, http = false, river = false;
    for (const Cell& c : cells) {
      pgq |= c.system == "pgq";
      graphile |= c.system == "graphile";
      river |= c.system == "river";
      http |= c.variant == "http" || c.variant == "wrk";
    }
    if (http && system("command -v nginx >/dev/null 2>&1 && command -v wrk >/dev/null 2>&1") != 0) {
      std::cerr << "http cells: nginx or wrk missing; running scripts/install-deps.sh with nginx-light wrk\n";
      int st = system(
          ("RELAYBUS_EXTRA_PACKAGES='nginx-light wrk' bash " + opt_.repo + "/scripts/install-deps.sh >&2").c_str());
      if (st != 0 || system("command -v nginx >/dev/null 2>&1 && command -v wrk >/dev/null 2>&1") != 0)
        throw std::runtime_error("http cells: still no nginx or wrk (apt-get install nginx-light wrk)");
    }
    if (pgq) {
      std::string control = trim(run_capture(pg_config_ + " --sharedir")) + "/extension/pgq.control";
      auto have = [&]() {
        return access(control.c_str(), R_OK) == 0 && system("command -v pgqd >/dev/null 2>&1") == 0;
      };
      if (!have()) {
        std::cerr << "PgQ peer: " << control << " or pgqd missing; running scripts/install-deps.sh"
                  << " (postgresql-NN-pgq3, pgqd)\n";
        int st = system(("bash " + opt_.repo + "/scripts/install-deps.sh >&2").c_str());
        if (st != 0 || !have())
          throw std::runtime_error(
              "PgQ peer: still no " + control +
              " or pgqd. Install postgresql-NN-pgq3 and pgqd "
              "(scripts/install-deps.sh); a private tree from scripts/pg-tree.sh must be "
              "created again afterwards (it copies the system's extensions). Or run with --no-peers.");
      }
    }
    if (graphile) {
      std::string dir = opt_.repo + "/bench/graphile";
      if (system("command -v node >/dev/null 2>&1") != 0)
        throw std::runtime_error("graphile peer: node (>= 18) not found; install Node.js or run with --no-peers");
      if (access((dir + "/node_modules/graphile-worker/package.json").c_str(), R_OK) != 0) {
        std::cerr << "graphile peer: npm ci in " << dir << "\n";
        if (system(("cd '" + dir + "' && npm ci --no-audit --no-fund >&2").c_str()) != 0)
          throw std::runtime_error("graphile peer: npm ci failed in " + dir + " (or run with --no-peers)");
      }
    }
    if (river) {
      std::string why = build_river();
      if (!why.empty()) {
        std::cerr << "River: not installed (" << why << "); its cells are skipped\n";
        skipped_peers.push_back("River: not installed (" + why + ")");
        cells.erase(std::remove_if(cells.begin(), cells.end(), [](const Cell& c) { return c.system == "river"; }),
                    cells.end());
      }
    }
  }

  // Builds bench/river/river-bench (River at the version go.mod pins; modules from the Go
  // module proxy into the module cache, outside the repo). "" or why it could not.
  std::string build_river() {
    std::string dir = opt_.repo + "/bench/river";
    if (system("command -v go >/dev/null 2>&1") != 0) return "no go command; River v0.51.2 needs Go >= 1.26";
    int st = 0;
    // GOTOOLCHAIN=auto: an older go (>= 1.21) fetches the go.mod's toolchain
    // from the Go module proxy, as the FerretDB build of the tests does.
    std::string log =
        run_capture("cd '" + dir + "' && GOTOOLCHAIN=auto GOFLAGS=-mod=mod go build -o river-bench . 2>&1", &st);
    if (st == 0) return "";
    std::string last = trim(log);
    size_t nl = last.rfind('\n');
    if (nl != std::string::npos) last = last.substr(nl + 1);
    return "go build in bench/river failed: " + last;
  }

  // initdb + start + the bench database, roles and the systems the cells use (once per run and build).
  void start_cluster(const std::vector<Cell>& cells) {
    char tmpl[] = "/tmp/rbbench.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
    g_clusters[dir_] = pg_config_;
    // RELAYBUS_BENCH_CONF: lines appended to the cluster's settings (an A/B of one setting).
    std::string conf = kClusterConf;
    if (const char* extra = getenv("RELAYBUS_BENCH_CONF")) conf += std::string("\n") + extra;
    setenv("RELAYBUS_EXTRA_CONF", conf.c_str(), 1);
    setenv("RELAYBUS_PRELOAD", "relaybus,pg_stat_statements", 1);
    cluster("start");
    std::string env = read_file(dir_ + "/env");
    size_t p = env.find("PGPORT=");
    if (p == std::string::npos) throw std::runtime_error("no PGPORT in " + dir_ + "/env");
    port_ = std::to_string(atoi(env.c_str() + p + 7));
    Conn boot(conninfo("postgres", "postgres"));
    boot.exec("CREATE ROLE bench_admin SUPERUSER LOGIN");
    boot.exec("CREATE DATABASE bench");
    boot.close();
    connect_all();
    setup_.exec("CREATE EXTENSION pg_stat_statements");
    // Child directories are written by the children (root) only; the server needs none of them.
    tmp_ = out_ + "/tmp" + (side_.empty() ? "" : "-" + side_);
    mkdirs(tmp_);
    std::set<std::string> used;
    for (const Cell& c : cells) used.insert(c.system);
    for (auto& kv : systems_)
      if (used.count(kv.first)) kv.second->install(setup_);
    set_http_receiver_dir(tmp_);
  }

  // A/B: stop this build's cluster (fast shutdown) so the other one runs alone; resume() starts it again
  // on the same data directory and port.
  void suspend() {
    close_all();
    cluster("stop");
  }
  void resume() {
    cluster("start");
    connect_all();
  }

  void stop_cluster() {
    stop_http_receiver();
    close_all();
    if (opt_.keep_cluster) {
      std::cerr << "cluster kept: " << dir_ << " (stop: PG_CONFIG=" << pg_config_ << " bash test/cluster.sh destroy "
                << dir_ << ")\n";
      g_clusters.erase(dir_);
    } else {
      destroy_cluster_now(dir_);
    }
    if (!opt_.keep_tmp) rmtree(tmp_);
  }

  void cluster(const std::string& verb) {
    int st = 0;
    std::string log = run_capture(cluster_cmd(pg_config_, verb, dir_) + " 2>&1", &st);
    append_file(out_ + "/cluster.log", (side_.empty() ? "" : "[" + side_ + "] ") + verb + ":\n" + log);
    if (st != 0) throw std::runtime_error("cluster " + verb + " failed:\n" + log);
  }
  void connect_all() {
    setup_.connect(conninfo("postgres", "bench"));
    setup2_.connect(conninfo("postgres", "bench"));
    admin_.connect(conninfo("bench_admin", "bench"));
  }
  void close_all() {
    setup_.close();
    setup2_.close();
    admin_.close();
  }

  std::string conninfo(const std::string& user, const std::string& db) const {
    return "host=" + dir_ + " port=" + port_ + " user=" + user + " dbname=" + db + " application_name=bench";
  }

  Json server_env() {
    Json j = Json::object();
    j["version"] = admin_.one("SELECT version()");
    j["server_version_num"] = admin_.one("SHOW server_version_num");
    Json s = Json::object();
    Result r = admin_.exec(
        "SELECT name, setting, coalesce(unit, ''), source FROM pg_settings"
        " WHERE source NOT IN ('default', 'override') OR name IN ('fsync', 'synchronous_commit',"
        " 'full_page_writes', 'shared_buffers', 'max_wal_size', 'checkpoint_timeout', 'wal_level',"
        " 'pg_stat_statements.track', 'wal_buffers', 'commit_delay', 'autovacuum', 'data_checksums',"
        " 'wal_sync_method', 'huge_pages', 'max_connections', 'work_mem', 'effective_io_concurrency')"
        " ORDER BY name");
    for (int i = 0; i < r.rows(); i++) {
      std::string v = r.str(i, 1);
      if (!r.str(i, 2).empty()) v += " (" + r.str(i, 2) + ")";
      s[r.str(i, 0)] = v;
    }
    j["settings"] = s;
    j["cluster_conf_added"] = kClusterConf;
    return j;
  }

  double warmup(const Cell& c) const {
    if (opt_.warmup_s >= 0) return opt_.warmup_s;
    if (c.group == Group::Mixed) return opt_.quick ? 2 : 3;
    return opt_.quick ? 1 : 2;
  }
  double window(const Cell& c) const {
    if (opt_.window_s > 0) return opt_.window_s;
    if (c.group == Group::Mixed) return opt_.quick ? 8 : 12;
    return opt_.quick ? 4 : 6;
  }

  // A backlog that should outlast warm-up + window: from the best rate seen so
  // far for this cell (or its kind), or a generous default for the kind.
  long long backlog_for(const Cell& c, double factor) {
    double est = 0;
    // A burst after idle is as large as its analyzed cell's backlog, however
    // slowly it drains: the two rates then compare like with like.
    const std::string suffix = ".after_idle";
    auto it = seen_cell_.find(c.after_idle ? c.name.substr(0, c.name.size() - suffix.size()) : c.name);
    if (it != seen_cell_.end())
      est = it->second;
    else {
      std::string kind = c.system + "/" + c.variant;
      std::string kind_d = kind + strf("/d%d", c.dispatchers);
      double def = 30000;
      if (c.system == "floor")
        def = (c.variant == "delete+notify" ? 45000 : 60000) * std::sqrt(double(c.consumers));
      else if (c.variant == "pull")
        def = c.profile == "tuned" ? 40000 : 25000 * std::sqrt(double(c.consumers));
      else if (c.variant == "notify-ack")
        def = 30000;
      else if (c.variant == "notify-fire")
        def = 32000 * std::sqrt(double(std::max(1, c.dispatchers)));
      else if (c.system == "pgq")
        def = c.batch >= 5000 ? 180000 : 60000;  // reading writes nothing: fast
      else if (c.system == "graphile")
        def = 15000;
      else if (c.system == "river")
        def = 20000;
      else if (c.variant == "http")
        def = 4000 * std::sqrt(double(std::max(1, c.concurrency)));
      // A kind seen with this many dispatchers; else the kind's best, scaled to the dispatchers.
      double seen = seen_kind_.count(kind_d) ? seen_kind_[kind_d]
                                             : seen_kind_[kind] * std::sqrt(double(std::max(1, c.dispatchers)));
      est = std::max(def, seen);
    }
    double secs = warmup(c) + window(c) + 1.5;
    long long n = (long long)(est * secs * 1.3 * factor);
    return std::min(std::max(n, 20000LL), 6000000LL);
  }

  std::vector<SampleResult> run_cell(const Cell& c, int sample_no) {
    std::vector<SampleResult> out;
    SampleResult r = run_sample(c, sample_no, 1.0);
    out.push_back(r);
    bool drained = false;
    for (const std::string& why : r.invalid)
      if (why.find("drained") != std::string::npos) drained = true;
    if (drained && opt_.retry_drained) {
      std::cerr << "    backlog drained: repeating the sample with a 2.5x larger backlog\n";
      out.back().json["repeated_with_larger_backlog"] = true;
      out.push_back(run_sample(c, sample_no, 2.5));
    }
    return out;
  }

 private:
  struct Child {
    ChildSpec spec;
    pid_t pid = -1;
    int ready_fd = -1, go_fd = -1;
    int backend_pid = 0;
    bool counts = false;
  };

  static bool counts_units(const Cell& c, const ChildSpec& s) {
    // A peer's own publisher program (River) counts its events like a Publish child.
    if (c.group == Group::Publish || c.group == Group::Mixed)
      return s.role == Role::Publish || (s.role == Role::External && s.reports_units);
    if (s.role == Role::External) return s.reports_units;
    return s.role == Role::ClaimAck || s.role == Role::Take || s.role == Role::Listen || s.role == Role::PgqBatch ||
           s.role == Role::HttpLog;
  }
  static bool writes_receipts(const ChildSpec& s) {
    return s.role == Role::Listen || s.role == Role::ClaimAck || s.role == Role::PgqBatch || s.role == Role::HttpLog ||
           (s.role == Role::External && s.reports_units);
  }

  // Runs statements on the setup connection, and on a second one at the same time when parallel.
  void run_parallel(const std::vector<std::string>& sql, bool parallel) {
    if (!parallel) {
      for (const std::string& q : sql) setup_.exec(q);
      return;
    }
    Conn* conns[2] = {&setup_, &setup2_};
    bool busy[2] = {false, false};
    size_t next = 0;
    auto finish = [&](int k) {
      PGresult* res;
      std::string err;
      while ((res = PQgetResult(conns[k]->raw())) != nullptr) {
        ExecStatusType st = PQresultStatus(res);
        if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK && err.empty()) err = PQresultErrorMessage(res);
        PQclear(res);
      }
      busy[k] = false;
      if (!err.empty()) throw std::runtime_error("preload: " + err);
    };
    while (next < sql.size() || busy[0] || busy[1]) {
      for (int k = 0; k < 2; k++) {
        if (!busy[k] && next < sql.size()) {
          if (!PQsendQuery(conns[k]->raw(), sql[next].c_str()))
            throw std::runtime_error(std::string("preload: ") + PQerrorMessage(conns[k]->raw()));
          next++;
          busy[k] = true;
        }
      }
      pollfd p[2];
      int np = 0, which[2];
      for (int k = 0; k < 2; k++)
        if (busy[k]) {
          which[np] = k;
          p[np++] = pollfd{PQsocket(conns[k]->raw()), POLLIN, 0};
        }
      if (np == 0) break;
      poll(p, np, 1000);
      for (int i = 0; i < np; i++) {
        int k = which[i];
        if (!PQconsumeInput(conns[k]->raw()))
          throw std::runtime_error(std::string("preload: ") + PQerrorMessage(conns[k]->raw()));
        if (!PQisBusy(conns[k]->raw())) finish(k);
      }
    }
  }

  void spawn(std::vector<Child>& kids) {
    for (Child& k : kids) {
      int rp[2], gp[2];
      if (pipe(rp) != 0 || pipe(gp) != 0) throw std::runtime_error("pipe failed");
      fflush(nullptr);
      pid_t pid = fork();
      if (pid < 0) throw std::runtime_error("fork failed");
      if (pid == 0) {
        close(rp[0]);
        close(gp[1]);
        for (Child& other : kids) {
          if (other.ready_fd >= 0) close(other.ready_fd);
          if (other.go_fd >= 0) close(other.go_fd);
        }
        child_main(k.spec, rp[1], gp[0]);
      }
      close(rp[1]);
      close(gp[0]);
      k.pid = pid;
      k.ready_fd = rp[0];
      k.go_fd = gp[1];
      g_children.push_back(pid);
    }
  }

  // Waits for every child to report ready; returns "" or the first error.
  std::string wait_ready(std::vector<Child>& kids) {
    std::string err;
    int64_t deadline = mono_ns() + 60000000000LL;
    for (Child& k : kids) {
      pollfd p{k.ready_fd, POLLIN, 0};
      int left = int(std::max<int64_t>(0, (deadline - mono_ns()) / 1000000));
      if (poll(&p, 1, left) <= 0) {
        if (err.empty()) err = k.spec.label + ": not ready within 60 s";
        continue;
      }
      char buf[2048];
      ssize_t n = read(k.ready_fd, buf, sizeof buf - 1);
      buf[n > 0 ? n : 0] = 0;
      if (n <= 0 || buf[0] != 'r') {
        if (err.empty()) err = k.spec.label + ": " + (n > 1 ? std::string(buf + 1) : "died during setup");
      } else {
        k.backend_pid = atoi(buf + 1);
      }
      close(k.ready_fd);
      k.ready_fd = -1;
    }
    return err;
  }

  // Waits for the given children to exit; SIGKILLs them after the deadline. Returns how many had to be killed.
  int reap(std::vector<Child*> kids, int64_t deadline) {
    int killed = 0;
    for (Child* k : kids) {
      if (k->pid <= 0) continue;
      for (;;) {
        int st;
        pid_t r = waitpid(k->pid, &st, WNOHANG);
        if (r == k->pid || r < 0) break;
        if (mono_ns() > deadline) {
          kill(k->pid, SIGKILL);
          waitpid(k->pid, &st, 0);
          killed++;
          // Its backend may still be running the statement: end it too.
          if (k->backend_pid > 0) {
            try {
              admin_.exec(strf("SELECT pg_terminate_backend(%d)", k->backend_pid));
            } catch (...) {
            }
          }
          break;
        }
        sleep_ms(10);
      }
      g_children.erase(std::remove(g_children.begin(), g_children.end(), k->pid), g_children.end());
      k->pid = -1;
    }
    return killed;
  }

  SampleResult run_sample(const Cell& c, int sample_no, double backlog_factor) {
    System& sys = *systems_.at(c.system);
    SampleResult r;
    r.cell = c;
    r.sample_no = sample_no;
    r.side = side_;
    auto& m = r.m;
    Json& j = r.json;
    j = Json::object();
    j["cell"] = c.name;
    if (!side_.empty()) j["side"] = side_;
    j["group"] = group_name(c.group);
    j["system"] = c.system;
    j["variant"] = c.variant;
    j["profile"] = c.profile;
    j["sample"] = sample_no;
    j["started_at"] = utc_stamp(false);
    Json params = Json::object();
    params["publishers"] = c.publishers;
    params["batch"] = c.batch;
    params["handlers"] = c.handlers;
    params["keys"] = keys_name(c.keys);
    params["dispatchers"] = c.dispatchers;
    params["batch_size"] = c.batch_size;
    params["consumers"] = c.consumers;
    params["per_key"] = c.per_key;
    params["rate"] = c.rate;
    params["concurrency"] = c.concurrency;
    params["floor"] = c.floor;
    j["params"] = params;
    double warm = warmup(c), win = window(c);
    j["warmup_s"] = warm;
    j["window_s"] = win;

    std::string sdir = tmp_ + "/" + sanitize(c.name) + "-" + std::to_string(sample_no) + "-" + std::to_string(++seq_);
    mkdirs(sdir);
    std::vector<Child> kids;
    try {
      sys.prepare(setup_, admin_, c);
      long long preloaded = -1;
      if (c.after_idle) {
        // As after a quiet period: the table empty and vacuumed, and no
        // statistics from the cells before (TRUNCATE keeps pg_statistic).
        setup_.exec("DELETE FROM pg_catalog.pg_statistic WHERE starelid = " + sql_lit(sys.main_table(c)) +
                    "::regclass");
        setup_.exec("VACUUM " + sys.main_table(c));
      } else if (c.group == Group::Dispatch) {
        long long want = backlog_for(c, backlog_factor);
        int64_t t = mono_ns();
        bool parallel = false;
        run_parallel(sys.preload_sql(c, want, &parallel), parallel);
        if (!(c.system == "floor" && (c.variant == "notify" || c.variant == "wrk")))
          setup_.exec("VACUUM (ANALYZE) " + sys.main_table(c));
        preloaded = sys.backlog(admin_, c);
        j["preload_s"] = double(mono_ns() - t) / 1e9;
      }
      m["preloaded"] = double(preloaded);
      std::vector<uint64_t> expected;
      bool exact = sys.checks_exactness(c);
      if (exact && c.group == Group::Dispatch && !c.after_idle) sys.expected(setup_, c, &expected);
      admin_.exec("CHECKPOINT");
      j["settings"] = sys.settings(admin_);

      m["spin_ms"] = cpu_spin_ms();
      for (ChildSpec& s : sys.children(c, conninfo("postgres", "bench"))) {
        Child k;
        k.spec = s;
        k.spec.dir = sdir;
        k.counts = counts_units(c, s);
        kids.push_back(k);
      }
      spawn(kids);
      std::string err = wait_ready(kids);
      if (!err.empty()) throw std::runtime_error("child setup failed: " + err);
      sys.start_delivery(admin_, c);
      if (c.after_idle) {
        // The dispatchers idle (each poll plans its claim on the empty
        // table) while the burst is written in one transaction; it
        // commits at once, and the expected deliveries are read inside it.
        const double idle_s = 3;  // three polls at relaybus.poll_interval's default
        int64_t t = mono_ns();
        int64_t idle_until = t + int64_t(idle_s * 1e9);
        long long want = backlog_for(c, backlog_factor);
        bool parallel = false;
        setup_.exec("BEGIN");
        for (const std::string& q : sys.preload_sql(c, want, &parallel)) setup_.exec(q);
        if (exact) sys.expected(setup_, c, &expected);
        preloaded = sys.backlog(setup_, c);
        sleep_until_mono(idle_until);
        setup_.exec("COMMIT");
        m["preloaded"] = double(preloaded);
        j["preload_s"] = double(mono_ns() - t) / 1e9;
        j["idle_s"] = idle_s;
      }

      Go go;
      go.t_warm = mono_ns();
      go.t0 = go.t_warm + int64_t(warm * 1e9);
      go.t1 = go.t0 + int64_t(win * 1e9);
      for (Child& k : kids) {
        (void)!write(k.go_fd, &go, sizeof go);
        close(k.go_fd);
        k.go_fd = -1;
      }
      sleep_until_mono(go.t0);
      admin_.exec("SELECT pg_stat_statements_reset(), pg_stat_reset_shared('wal'), pg_stat_reset()");
      std::string lsn0 = admin_.one("SELECT pg_current_wal_lsn()");
      CpuStat cpu0 = read_cpu();
      std::map<int, double> disp_cpu0;
      for (int pid : sys.server_pids(admin_)) disp_cpu0[pid] = proc_cpu_s(pid);
      m["load1"] = loadavg1();
      m["reset_ms"] = double(mono_ns() - go.t0) / 1e6;
      if (opt_.inject_loss && c.group != Group::Publish && exact) {
        sleep_until_mono(go.t0 + (go.t1 - go.t0) / 2);
        std::string what = sys.inject_loss(admin_, c);
        j["injected_loss"] = what;
        std::cerr << "    test mode: " << what << "\n";
      }
      sleep_until_mono(go.t1);
      CpuStat cpu1 = read_cpu();
      m["cpu_busy"] = cpu1.total > cpu0.total ? double(cpu1.busy - cpu0.busy) / double(cpu1.total - cpu0.total) : NAN;
      long long backlog_t1 = sys.backlog(admin_, c);
      j["system_stats"] = sys.sample_stats(admin_, c);
      m["backlog_t1"] = double(backlog_t1);
      Json rss = Json::array();
      double rss_max = 0, anon_max = 0, shmem_max = 0, hwm_max = 0;
      std::vector<int> pids = sys.server_pids(admin_);
      double disp_cpu = 0;
      for (int pid : pids) {
        if (disp_cpu0.count(pid)) disp_cpu += proc_cpu_s(pid) - disp_cpu0[pid];
        auto st = proc_status_kb(pid);
        Json one = Json::object();
        one["pid"] = pid;
        for (auto& kv : st) one[kv.first + "_kb"] = kv.second;
        rss.push(one);
        rss_max = std::max(rss_max, double(st["VmRSS"]));
        anon_max = std::max(anon_max, double(st["RssAnon"]));
        shmem_max = std::max(shmem_max, double(st["RssShmem"]));
        hwm_max = std::max(hwm_max, double(st["VmHWM"]));
      }
      j["dispatcher_memory"] = rss;
      m["dispatchers_seen"] = double(pids.size());
      if (!pids.empty()) {
        m["dispatcher_cpu_s"] = disp_cpu;
        m["dispatcher_cpu_share"] = disp_cpu / win;
        m["rss_kb"] = rss_max;
        m["rss_anon_kb"] = anon_max;
        m["rss_shmem_kb"] = shmem_max;
        m["rss_hwm_kb"] = hwm_max;
      }

      // Stop: workers end at t1 by themselves; then in-server delivery; then listeners drain.
      std::vector<Child*> workers, listeners;
      for (Child& k : kids)
        (k.spec.role == Role::Listen || k.spec.role == Role::HttpLog ? listeners : workers).push_back(&k);
      int killed = reap(workers, go.t1 + 15000000000LL);
      sys.stop_delivery(admin_, c);
      for (Child* k : listeners) kill(k->pid, SIGUSR1);
      killed += reap(listeners, mono_ns() + 60000000000LL);
      if (killed > 0)
        r.invalid.push_back(
            strf("%d child process(es) still in a call 15 s after the window had to be killed", killed));
      m["stop_s"] = double(mono_ns() - go.t1) / 1e9;
      sleep_ms(200);

      read_counters(c, sys, lsn0, m, j);

      // What the children counted.
      long long units_window = 0, units_since = 0, units_total = 0, deliv_window = 0, errors = 0, empty = 0;
      std::vector<double> p50s, p99s;
      std::string first_error;
      Json kidj = Json::array();
      for (Child& k : kids) {
        ChildOut o = read_child_out(sdir, k.spec.label);
        if (!o.ok) r.invalid.push_back(k.spec.label + " wrote no result");
        if (k.counts) {
          units_window += o.units_window;
          units_since += o.units_since_t0;
          units_total += o.units_total;
          empty += o.empty_in_window;
        }
        if (c.group == Group::Mixed && k.spec.role == Role::Listen) deliv_window += o.units_window;
        errors += o.errors;
        if (first_error.empty() && !o.first_error.empty()) first_error = k.spec.label + ": " + o.first_error;
        if (std::isfinite(o.call_p50_us)) p50s.push_back(o.call_p50_us);
        if (std::isfinite(o.call_p99_us)) p99s.push_back(o.call_p99_us);
        Json kj = Json::object();
        kj["label"] = k.spec.label;
        kj["units_window"] = o.units_window;
        kj["units_since_t0"] = o.units_since_t0;
        kj["units_total"] = o.units_total;
        kj["errors"] = o.errors;
        kj["empty_in_window"] = o.empty_in_window;
        kj["call_p50_us"] = o.call_p50_us;
        kj["call_p99_us"] = o.call_p99_us;
        kidj.push(kj);
      }
      j["children"] = kidj;
      m["units_window"] = double(units_window);
      m["units_since_t0"] = double(units_since);
      m["rate"] = double(units_window) / win;
      // Whole-machine CPU per unit (includes everything else running on the machine).
      m["cpu_us_pu"] = units_window > 0
                           ? m["cpu_busy"] * double(sysconf(_SC_NPROCESSORS_ONLN)) * win * 1e6 / double(units_window)
                           : NAN;
      m["errors"] = double(errors);
      if (!p50s.empty()) m["call_p50_us"] = median(p50s);
      if (!p99s.empty()) m["call_p99_us"] = *std::max_element(p99s.begin(), p99s.end());
      if (!first_error.empty()) j["first_error"] = first_error;
      if (errors > 0)
        r.invalid.push_back(strf("%lld errors in child processes (first: %s)", errors, first_error.c_str()));
      if (units_window == 0) r.invalid.push_back("nothing was counted in the window");
      // Drained: nothing left at the end of the window. (An empty claim alone is not proof: a claim
      // that loses a race for the same rows to a concurrent consumer can come back empty too.)
      m["empty_claims"] = double(empty);
      if (c.group == Group::Dispatch && backlog_t1 == 0)
        r.invalid.push_back(strf(
            "backlog drained during the window (backlog at end 0 of %lld; empty claims/takes %lld)", preloaded, empty));
      if (c.group == Group::Publish) {
        // Every published event left exactly rows_per_event rows (deliveries, or floor rows).
        long long want = units_total * sys.rows_per_event(c), have = sys.backlog(admin_, c);
        m["rows_expected"] = double(want);
        m["rows_found"] = double(have);
        if (want != have)
          r.invalid.push_back(strf("publish: %lld events x %d should have left %lld rows, found %lld", units_total,
                                   sys.rows_per_event(c), want, have));
      }
      if (c.group == Group::Mixed) {
        m["target_rate"] = c.rate;
        m["accepted_rate"] = double(units_window) / win;
        m["delivered_rate"] = double(deliv_window) / win;
      }

      // Counters per unit: statements and WAL bytes over the client-counted units since t0
      // (exact in time); pgstat counters over the units pgstat itself counted.
      if (!sys.pgstat_counts_units(c)) m["units_pgstat"] = double(units_since);
      double u = double(units_since), up = m["units_pgstat"];
      auto per = [](double x, double d) { return d > 0 ? x / d : NAN; };
      m["stmts_pu"] = per(m["stmts"], u);
      m["stmts_top_pu"] = per(m["stmts_top"], u);
      m["wal_bytes_pu"] = per(m["wal_bytes"], u);
      m["wal_records_pu"] = per(m["wal_records"], up);
      m["wal_fpi_pu"] = per(m["wal_fpi"], up);
      m["pgstat_wal_bytes_pu"] = per(m["pgstat_wal_bytes"], up);
      m["main_ins_pu"] = per(m["main_ins"], up);
      m["main_upd_pu"] = per(m["main_upd"], up);
      m["main_del_pu"] = per(m["main_del"], up);
      m["keyseq_upd_pu"] = per(m["keyseq_upd"], up);
      m["keyseq_ins_pu"] = per(m["keyseq_ins"], up);
      if (c.group == Group::Publish && c.batch > 1)
        m["stmts_top_per_call"] = per(m["stmts_top"], u / c.batch);
      else if (c.group != Group::Dispatch)
        m["stmts_top_per_call"] = m["stmts_top_pu"];

      // Exactness and latency.
      std::vector<Receipt> rec;
      std::vector<PubRec> pubs;
      for (Child& k : kids) {
        if (writes_receipts(k.spec)) {
          auto v = read_receipts(sdir, k.spec.label);
          rec.insert(rec.end(), v.begin(), v.end());
        }
        if (k.spec.role == Role::Publish && k.spec.record_pubs) {
          auto v = read_pubs(sdir, k.spec.label);
          pubs.insert(pubs.end(), v.begin(), v.end());
        }
      }
      if (c.group == Group::Mixed) latency(rec, pubs, go, m);
      if (exact) {
        if (c.group == Group::Mixed)
          for (const PubRec& p : pubs)
            for (int h = 0; h < c.handlers; h++) expected.push_back(ident(p.event_id, h));
        check_exactness(c, sys, expected, rec, r);
      }
    } catch (const std::exception& e) {
      r.invalid.push_back(std::string("sample failed: ") + e.what());
      for (Child& k : kids)
        if (k.pid > 0) kill(k.pid, SIGKILL);
      std::vector<Child*> all;
      for (Child& k : kids) all.push_back(&k);
      reap(all, mono_ns());
      for (Child& k : kids) {
        if (k.backend_pid <= 0) continue;
        try {
          admin_.exec(strf("SELECT pg_terminate_backend(%d)", k.backend_pid));
        } catch (...) {
        }
      }
      try {
        sys.stop_delivery(admin_, c);
      } catch (...) {
      }
    }
    for (Child& k : kids) {
      if (k.ready_fd >= 0) close(k.ready_fd);
      if (k.go_fd >= 0) close(k.go_fd);
    }
    if (!opt_.keep_tmp) rmtree(sdir);

    r.valid = r.invalid.empty();
    if (r.valid && m.count("rate")) {
      seen_cell_[c.name] = std::max(seen_cell_[c.name], m["rate"]);
      std::string kind = c.system + "/" + c.variant;
      seen_kind_[kind] = std::max(seen_kind_[kind], m["rate"] / std::sqrt(double(std::max(1, c.dispatchers))));
      std::string kind_d = kind + strf("/d%d", c.dispatchers);
      seen_kind_[kind_d] = std::max(seen_kind_[kind_d], m["rate"]);
    }
    j["valid"] = r.valid;
    Json inv = Json::array();
    for (auto& s : r.invalid) inv.push(s);
    j["invalid_reasons"] = inv;
    Json mj = Json::object();
    for (auto& kv : m) mj[kv.first] = kv.second;
    j["metrics"] = mj;
    return r;
  }

  void read_counters(const Cell& c, System& sys, const std::string& lsn0, std::map<std::string, double>& m, Json& j) {
    Result w = admin_.exec("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), " + sql_lit(lsn0) +
                           "), wal_records, wal_fpi, wal_bytes FROM pg_stat_wal");
    m["wal_bytes"] = w.f64(0, 0);
    m["wal_records"] = w.f64(0, 1);
    m["wal_fpi"] = w.f64(0, 2);
    m["pgstat_wal_bytes"] = w.f64(0, 3);
    const std::string filter =
        " FROM pg_stat_statements s WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
        " AND s.userid <> 'bench_admin'::regrole";
    Result s = admin_.exec("SELECT coalesce(sum(calls), 0), coalesce(sum(calls) FILTER (WHERE toplevel), 0)" + filter);
    m["stmts"] = s.f64(0, 0);
    m["stmts_top"] = s.f64(0, 1);
    Result top = admin_.exec(
        "SELECT calls, toplevel, rows, round(mean_exec_time::numeric, 3),"
        " left(regexp_replace(query, '\\s+', ' ', 'g'), 160)" +
        filter + " ORDER BY calls DESC, query LIMIT 12");
    Json tj = Json::array();
    for (int i = 0; i < top.rows(); i++) {
      Json e = Json::object();
      e["calls"] = top.i64(i, 0);
      e["toplevel"] = top.str(i, 1) == "t";
      e["rows"] = top.i64(i, 2);
      e["mean_ms"] = top.f64(i, 3);
      e["query"] = top.str(i, 4);
      tj.push(e);
    }
    j["statements"] = tj;
    std::string list = "{";
    for (const std::string& t : sys.tables(c)) array_append(&list, t.c_str());
    list += "}";
    Result t = admin_.exec_params(
        "SELECT schemaname || '.' || relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, n_live_tup,"
        " n_dead_tup, autovacuum_count, autoanalyze_count FROM pg_stat_user_tables"
        " WHERE schemaname || '.' || relname = ANY ($1::text[]) ORDER BY 1",
        {list.c_str()});
    Json tables = Json::object();
    std::string main = sys.main_table(c);
    for (int i = 0; i < t.rows(); i++) {
      std::string name = t.str(i, 0);
      Json e = Json::object();
      const char* cols[] = {"ins", "upd", "hot_upd", "del", "live", "dead", "autovacuum", "autoanalyze"};
      for (int k = 0; k < 8; k++) e[cols[k]] = t.i64(i, k + 1);
      double upd = t.f64(i, 2), hot = t.f64(i, 3);
      e["hot_share"] = upd > 0 ? hot / upd : NAN;
      tables[name] = e;
      if (name == main) {
        m["main_ins"] = t.f64(i, 1);
        m["main_upd"] = upd;
        m["main_hot_upd"] = hot;
        m["main_del"] = t.f64(i, 4);
        m["main_hot_share"] = upd > 0 ? hot / upd : NAN;
        m["main_dead_end"] = t.f64(i, 6);
        m["main_autovacuum"] = t.f64(i, 7);
      }
      if (name == "relay.key_seqs") {
        m["keyseq_ins"] = t.f64(i, 1);
        m["keyseq_upd"] = upd;
        m["keyseq_hot_share"] = upd > 0 ? hot / upd : NAN;
      }
    }
    j["tables"] = tables;
    double rows = c.group == Group::Dispatch ? m["main_del"] : m["main_ins"];
    int per = c.group == Group::Dispatch ? 1 : std::max(1, sys.rows_per_event(c));
    m["units_pgstat"] = rows / per;
  }

  static void latency(const std::vector<Receipt>& rec, const std::vector<PubRec>& pubs, const Go& go,
                      std::map<std::string, double>& m) {
    std::unordered_map<int64_t, const PubRec*> by_id;
    by_id.reserve(pubs.size() * 2);
    for (const PubRec& p : pubs) by_id[p.event_id] = &p;
    std::vector<int64_t> lat;
    long long negative = 0;
    std::unordered_set<uint64_t> seen;
    for (const Receipt& x : rec) {
      auto it = by_id.find(x.event_id);
      if (it == by_id.end()) continue;
      const PubRec* p = it->second;
      if (p->mono_ns < go.t0 || p->mono_ns > go.t1) continue;
      if (!seen.insert(ident(x.event_id, x.handler)).second) continue;
      int64_t d = x.real_ns - p->real_ns;
      if (d < 0) negative++;
      lat.push_back(d);
    }
    std::sort(lat.begin(), lat.end());
    long long published_in_window = 0;
    for (const PubRec& p : pubs)
      if (p.mono_ns >= go.t0 && p.mono_ns <= go.t1) published_in_window++;
    m["lat_n"] = double(lat.size());
    m["lat_published"] = double(published_in_window);
    m["lat_negative"] = double(negative);
    if (!lat.empty()) {
      m["lat_p50_ms"] = percentile_sorted(lat, 50) / 1e6;
      m["lat_p95_ms"] = percentile_sorted(lat, 95) / 1e6;
      m["lat_p99_ms"] = percentile_sorted(lat, 99) / 1e6;
      m["lat_max_ms"] = double(lat.back()) / 1e6;
    }
  }

  void check_exactness(const Cell& c, System& sys, const std::vector<uint64_t>& expected, std::vector<Receipt>& rec,
                       SampleResult& r) {
    auto& m = r.m;
    std::vector<PendingRow> pend;
    std::vector<uint64_t> dead;
    sys.pending(setup_, c, &pend);
    sys.dead(setup_, c, &dead);
    bool fire = c.variant == "notify-fire" || c.variant == "http" || c.group == Group::Mixed;
    // Delivered: fire mode = received; pull and ack mode = acknowledged.
    std::vector<Receipt> del;
    long long bad = 0;
    for (const Receipt& x : rec) {
      if (x.flags & 2) bad++;
      if (fire || (x.flags & 1)) del.push_back(x);
    }
    std::stable_sort(del.begin(), del.end(), [](const Receipt& a, const Receipt& b) { return a.mono_ns < b.mono_ns; });
    std::unordered_map<uint64_t, int> got;
    got.reserve(del.size() * 2);
    long long dup = 0, order = 0, order_checked = 0;
    std::unordered_map<uint64_t, int64_t> last_seq;  // (handler, key) -> last seq delivered
    for (const Receipt& x : del) {
      uint64_t id = ident(x.event_id, x.handler);
      if (got[id]++ > 0) {
        dup++;
        continue;
      }
      if (x.key_id >= 0 && x.seq >= 0) {
        order_checked++;
        uint64_t hk = (uint64_t(uint16_t(x.handler)) << 32) | uint32_t(x.key_id);
        auto it = last_seq.find(hk);
        if (it != last_seq.end() && x.seq <= it->second) order++;
        if (it == last_seq.end() || x.seq > it->second) last_seq[hk] = x.seq;
      }
    }
    std::unordered_set<uint64_t> pending_ids, dead_ids(dead.begin(), dead.end());
    pending_ids.reserve(pend.size() * 2);
    long long delivered_and_pending = 0, skipped = 0;
    std::unordered_map<uint64_t, int64_t> min_pending;
    for (const PendingRow& p : pend) {
      pending_ids.insert(p.id);
      if (got.count(p.id)) delivered_and_pending++;
      if (p.key_id >= 0 && p.seq >= 0) {
        uint64_t hk = (uint64_t(p.id & 7) << 32) | uint32_t(p.key_id);
        auto it = min_pending.find(hk);
        if (it == min_pending.end() || p.seq < it->second) min_pending[hk] = p.seq;
      }
    }
    // A key whose later delivery was handed over while an earlier one is still pending.
    for (auto& kv : min_pending) {
      auto it = last_seq.find(kv.first);
      if (it != last_seq.end() && kv.second < it->second) skipped++;
    }
    std::unordered_set<uint64_t> exp(expected.begin(), expected.end());
    long long lost = 0, unexpected = 0;
    for (uint64_t id : exp)
      if (!got.count(id) && !pending_ids.count(id) && !dead_ids.count(id)) lost++;
    for (auto& kv : got)
      if (!exp.count(kv.first)) unexpected++;
    r.exact_checked = true;
    m["ex_expected"] = double(exp.size());
    m["ex_delivered"] = double(got.size());
    m["ex_pending"] = double(pend.size());
    m["ex_dead"] = double(dead.size());
    m["ex_lost"] = double(lost);
    m["ex_dup"] = double(dup);
    m["ex_order"] = double(order + skipped);
    m["ex_skipped"] = double(skipped);
    m["ex_order_checked"] = double(order_checked);
    m["ex_unexpected"] = double(unexpected);
    m["ex_delivered_pending"] = double(delivered_and_pending);
    m["ex_bad_parse"] = double(bad);
    Json e = Json::object();
    for (const char* k : {"expected", "delivered", "pending", "dead", "lost", "dup", "order", "skipped",
                          "order_checked", "unexpected", "delivered_pending", "bad_parse"})
      e[k] = m[std::string("ex_") + k];
    r.json["exactness"] = e;
    if (lost || dup || order || skipped || unexpected || delivered_and_pending || dead.size() || bad)
      r.invalid.push_back(
          strf("exactness: lost %lld, duplicated %lld, out of order %lld (skipped %lld), dead %zu,"
               " unexpected %lld, delivered and pending %lld, unparsed %lld",
               lost, dup, order + skipped, skipped, dead.size(), unexpected, delivered_and_pending, bad));
  }

  const Options& opt_;
  std::string out_, pg_config_, side_, dir_, port_, tmp_;
  std::map<std::string, std::unique_ptr<System>> systems_;
  Conn setup_, setup2_, admin_;
  // Best rates seen, for backlog sizes: shared by the two builds of an A/B run, so both
  // sides of a pair preload backlogs sized from the same estimate.
  static std::map<std::string, double> seen_cell_, seen_kind_;
  int seq_ = 0;
};

std::map<std::string, double> Runner::seen_cell_, Runner::seen_kind_;

Json machine_env() {
  Json mach = Json::object();
  mach["nproc"] = (long)sysconf(_SC_NPROCESSORS_ONLN);
  std::string mi = read_file("/proc/meminfo");
  mach["mem_total"] = trim(mi.substr(0, mi.find('\n')).substr(9));
  std::string ci = read_file("/proc/cpuinfo");
  size_t p = ci.find("model name");
  if (p != std::string::npos) {
    std::string line = ci.substr(p, ci.find('\n', p) - p);
    mach["cpu_model"] = trim(line.substr(line.find(':') + 1));
  }
  mach["kernel"] = trim(run_capture("uname -sr"));
  mach["hostname_hash"] = trim(run_capture("hostname | sha256sum | cut -c1-12"));
  mach["loadavg_at_start"] = trim(read_file("/proc/loadavg"));
  return mach;
}

// The build a run measures: the tree's relaybus.so (its sha256 identifies the build) and the
// git state of src_dir, the checkout it was built from.
Json build_env(const std::string& pg_config, const std::string& src_dir) {
  Json build = Json::object();
  build["pg_config"] = pg_config;
  build["git_ref"] = trim(run_capture("git -C " + src_dir + " rev-parse HEAD 2>/dev/null"));
  std::string porcelain = run_capture("git -C " + src_dir + " status --porcelain --untracked-files=no 2>/dev/null");
  build["git_dirty"] = !trim(porcelain).empty();
  build["git_dirty_files"] = trim(porcelain);
  std::string pkglib = trim(run_capture(pg_config + " --pkglibdir"));
  build["relaybus_so"] = pkglib + "/relaybus.so";
  build["relaybus_so_sha256"] = trim(run_capture("sha256sum " + pkglib + "/relaybus.so | cut -c1-64"));
  build["relaybus_so_mtime"] = trim(run_capture("date -u -r " + pkglib + "/relaybus.so +%Y-%m-%dT%H:%M:%SZ"));
  // The same commit built in two directories differs in its debug info (the build path) and
  // hence its build-id; without both, equal code hashes equal (an A/A shows it).
  build["relaybus_so_sha256_code"] =
      trim(run_capture("t=$(mktemp) && objcopy --strip-debug --remove-section=.note.gnu.build-id " + pkglib +
                       "/relaybus.so $t 2>/dev/null && sha256sum $t | cut -c1-64; rm -f $t"));
  return build;
}

std::string one_line_summary(const SampleResult& r) {
  const auto& m = r.m;
  auto get = [&](const char* k) {
    auto it = m.find(k);
    return it == m.end() ? NAN : it->second;
  };
  std::string s = strf("%-44s %10.0f/s", r.cell.name.c_str(), get("rate"));
  if (r.cell.group == Group::Mixed) s += strf("  p50 %.2f p99 %.2f ms", get("lat_p50_ms"), get("lat_p99_ms"));
  s += strf("  stmts %.2f  WAL %.0f B  spin %.0f ms", get("stmts_pu"), get("wal_bytes_pu"), get("spin_ms"));
  if (r.exact_checked)
    s += strf("  lost %.0f dup %.0f order %.0f dead %.0f", get("ex_lost"), get("ex_dup"), get("ex_order"),
              get("ex_dead"));
  if (!r.valid) s += "  INVALID";
  return s;
}

// The gate's cells: the two publish shapes (one event per call, and batches of 100), a pull
// consumer and notify fire delivery: the paths a change to relaybus most often moves.
const char* kGateCells =
    "pub.relay.p8.b1.h1.unkeyed,pub.relay.p8.b100.h1.unkeyed,"
    "disp.relay.pull.defaults.f1.unkeyed,disp.relay.fire.d1.defaults.f1.unkeyed";

struct AbSide {
  std::string name;  // "base" | "candidate"
  std::string ref, commit, tree, pg_config;
};

// Builds one side's install tree with scripts/pg-tree.sh (output in build-<side>.log).
void build_tree(const Options& o, AbSide& s) {
  int st = 0;
  std::cerr << "building " << s.name << " (" << s.ref << " = " << s.commit.substr(0, 12) << ") into " << s.tree << "\n";
  std::string log = run_capture("bash " + o.repo + "/scripts/pg-tree.sh " + s.tree + " " + s.commit + " 2>&1", &st);
  write_file(o.out + "/build-" + s.name + ".log", log);
  std::vector<std::string> lines = split(trim(log), '\n');
  if (st != 0 || lines.empty()) throw std::runtime_error("pg-tree.sh failed for " + s.name + ":\n" + log);
  s.pg_config = trim(lines.back());
}

// Removes the install trees and the detached worktrees pg-tree.sh made for them.
void remove_trees(const Options& o, const std::string& root, const std::vector<AbSide>& sides) {
  for (const AbSide& s : sides) {
    std::string cmd = "git -C " + o.repo + " worktree remove --force " + s.tree + "/src >/dev/null 2>&1";
    (void)!system(cmd.c_str());
  }
  std::string prune = "git -C " + o.repo + " worktree prune";
  (void)!system(prune.c_str());
  rmtree(root);
}

// A/B: both builds, every cell, N pairs in ABBA order. Returns the exit status: 0, 1 (harness error),
// 3 (--gate and the gate failed).
int run_ab(Options& o, const std::vector<Cell>& cells, const std::string& run_id) {
  int64_t started = mono_ns();
  std::vector<AbSide> sides(2);
  sides[0].name = "base";
  sides[0].ref = o.base;
  sides[1].name = "candidate";
  sides[1].ref = o.candidate;
  std::string root = "/tmp/relaybus-ab-" + run_id;
  for (AbSide& s : sides) {
    int st = 0;
    s.commit = trim(run_capture("git -C " + o.repo + " rev-parse --verify --quiet '" + s.ref + "^{commit}'", &st));
    if (st != 0 || s.commit.empty()) {
      std::cerr << "relaybus-bench: not a commit: " << s.ref << "\n";
      return 2;
    }
    s.tree = root + "/" + s.name;
  }

  Json env = Json::object();
  env["run_id"] = run_id;
  env["mode"] = "ab";
  env["started_at"] = utc_stamp(false);
  env["args"] = o.argv_text;
  env["machine"] = machine_env();
  AbInput in;
  in.run_id = run_id;
  in.out_dir = o.out;
  in.args = o.argv_text;
  in.pairs = o.pairs;
  in.gate = o.gate;

  std::vector<std::unique_ptr<Runner>> runners;
  int rc = 0, running = -1;
  Json ab = Json::object();
  try {
    for (AbSide& s : sides) build_tree(o, s);
    for (AbSide& s : sides) {
      Json b = build_env(s.pg_config, s.tree + "/src");
      b["ref"] = s.ref;
      b["commit"] = s.commit;
      b["tree"] = s.tree;
      ab[s.name] = b;
    }
    ab["pairs"] = o.pairs;
    ab["gate"] = o.gate;
    ab["order"] =
        "per cell: pair k runs (S, O) for odd k and (O, S) for even k, S = the build whose cluster "
        "was running when the cell began";
    env["ab"] = ab;
    in.env = env;

    // Both clusters initdb'd with the same settings; only one runs at a time.
    for (AbSide& s : sides) runners.emplace_back(new Runner(o, o.out, s.pg_config, s.name));
    for (int i = 0; i < 2; i++) {
      if (running >= 0) runners[running]->suspend();
      runners[i]->start_cluster(cells);
      running = i;
      env["postgres_" + sides[i].name] = runners[i]->server_env();
    }
    write_file(o.out + "/env.json", env.dump() + "\n");
    std::string samples_path = o.out + "/samples.jsonl";
    write_file(samples_path, "");
    int switches = 0, idx = 0;
    for (const Cell& c : cells) {
      idx++;
      // Start with the build already running: no switch between cells, and pairs still alternate.
      int first = running;
      for (int k = 1; k <= o.pairs; k++) {
        int order[2] = {k % 2 == 1 ? first : 1 - first, k % 2 == 1 ? 1 - first : first};
        for (int side : order) {
          if (side != running) {
            runners[running]->suspend();
            runners[side]->resume();
            running = side;
            switches++;
          }
          std::cerr << strf("[%d/%zu] %s pair %d/%d: %s\n", idx, cells.size(), c.name.c_str(), k, o.pairs,
                            sides[side].name.c_str());
          for (SampleResult& r : runners[side]->run_cell(c, k)) {
            r.pair = k;
            r.json["pair"] = k;
            r.json["ab_position"] = side == order[0] ? 1 : 2;
            std::cerr << "    " << one_line_summary(r) << "\n";
            for (auto& why : r.invalid) std::cerr << "    invalid: " << why << "\n";
            append_file(samples_path, r.json.dump() + "\n");
            in.samples.push_back(r);
          }
        }
      }
    }
    env["cluster_switches"] = switches;
  } catch (const std::exception& e) {
    std::cerr << "relaybus-bench: " << e.what() << "\n";
    rc = 1;
  }
  for (int i = 0; i < int(runners.size()); i++) runners[i]->stop_cluster();
  // A kept cluster needs its tree's binaries: --keep-cluster keeps the trees too.
  if (!o.keep_trees && !o.keep_cluster)
    remove_trees(o, root, sides);
  else
    std::cerr << "install trees kept in " << root << " (worktrees: " << root << "/*/src)\n";
  in.minutes = double(mono_ns() - started) / 60e9;
  env["finished_at"] = utc_stamp(false);
  env["minutes"] = in.minutes;
  env["trees_kept"] = o.keep_trees;
  write_file(o.out + "/env.json", env.dump() + "\n");
  in.env = env;
  if (!in.samples.empty()) {
    AbOutcome res = write_ab_reports(in);
    std::cout << res.markdown;
    if (o.gate) {
      std::cerr << "gate: " << (res.gate_pass ? "PASS" : "FAIL") << "\n";
      if (!res.gate_pass && rc == 0) rc = 3;
    }
  }
  std::cerr << "results: " << o.out << "\n";
  return rc;
}

void usage() {
  std::cout
      << "usage: bench/relaybus-bench [options]\n"
         "  --quick              the quick subset with short windows (~4 min)\n"
         "  --cells P1,P2        only cells matching (substring, or glob with * ? [])\n"
         "  --no-floors          do not add the floors the selected cells compare with\n"
         "  --no-peers           leave out the peers (PgQ, graphile-worker, River)\n"
         "  --list               print the cells that would run and exit\n"
         "  --samples N          samples per cell (default 1)\n"
         "  --warmup S --window S  override warm-up and window seconds\n"
         "  --full-matrix        every publish combination (publishers x batch x handlers x keys)\n"
         "  --out DIR            results directory (default bench/results/<UTC stamp>)\n"
         "  --pg-config PATH     the build to measure (default: scripts/pg-config.sh, PG=NN or the Debian release's major)\n"
         "  --keep-cluster --keep-tmp  leave the cluster / the per-process files behind\n"
         "  --no-retry           do not repeat a sample whose backlog drained\n"
         "  --inject-loss        TEST MODE: delete one pending delivery mid-window (exactness must report lost = 1)\n"
         "A/B (two git refs, each built into its own install tree under /tmp; relaybus cells only, no floors):\n"
         "  --base REF --candidate REF  compare two builds: per cell N pairs in ABBA order, ratio with a 95% CI\n"
         "  --pairs N            pairs per cell (default 3)\n"
         "  --gate               the gate: 4 cells (unless --cells), quick windows; exit 3 when it fails\n"
         "  --keep-trees         keep the install trees and their git worktrees (/tmp/relaybus-ab-<stamp>; --keep-cluster too)\n";
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 0; i < argc; i++) o.argv_text += (i ? " " : "") + std::string(argv[i]);
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << a << " needs a value\n";
        exit(2);
      }
      return argv[++i];
    };
    if (a == "--quick")
      o.quick = true;
    else if (a == "--full-matrix")
      o.full_matrix = true;
    else if (a == "--list")
      o.list = true;
    else if (a == "--keep-cluster")
      o.keep_cluster = true;
    else if (a == "--keep-tmp")
      o.keep_tmp = true;
    else if (a == "--inject-loss")
      o.inject_loss = true;
    else if (a == "--no-floors")
      o.no_floors = true;
    else if (a == "--no-peers")
      o.no_peers = true;
    else if (a == "--no-retry")
      o.retry_drained = false;
    else if (a == "--cells")
      o.cells = next();
    else if (a == "--samples")
      o.samples = std::max(1, atoi(next().c_str()));
    else if (a == "--warmup")
      o.warmup_s = atof(next().c_str());
    else if (a == "--window")
      o.window_s = atof(next().c_str());
    else if (a == "--out")
      o.out = next();
    else if (a == "--pg-config")
      o.pg_config = next();
    else if (a == "--repo")
      o.repo = next();
    else if (a == "--base")
      o.base = next();
    else if (a == "--candidate")
      o.candidate = next();
    else if (a == "--gate")
      o.gate = true;
    else if (a == "--keep-trees")
      o.keep_trees = true;
    else if (a == "--pairs")
      o.pairs = std::max(1, atoi(next().c_str()));
    else if (a == "-h" || a == "--help") {
      usage();
      return 0;
    } else {
      std::cerr << "unknown option " << a << "\n";
      usage();
      return 2;
    }
  }
  if (o.repo.empty()) {
    char buf[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    std::string exe = n > 0 ? std::string(buf, size_t(n)) : std::string("./bench/relaybus-bench");
    std::string d = exe.substr(0, exe.rfind('/'));
    o.repo = d.substr(0, d.rfind('/'));
  }
  g_repo = o.repo;
  if (o.pg_config.empty()) o.pg_config = trim(run_capture("bash '" + o.repo + "/scripts/pg-config.sh'"));

  bool ab = !o.base.empty() || !o.candidate.empty();
  if (ab && (o.base.empty() || o.candidate.empty())) {
    std::cerr << "A/B needs both --base REF and --candidate REF\n";
    return 2;
  }
  if (!ab && o.gate) {
    std::cerr << "--gate needs --base REF --candidate REF\n";
    return 2;
  }
  if (o.gate) {
    if (o.cells.empty()) o.cells = kGateCells;
    o.quick = true;  // the quick windows, unless --warmup / --window say otherwise
  }
  std::vector<Cell> all = all_cells(o.full_matrix);
  if (o.no_peers)
    all.erase(std::remove_if(
                  all.begin(), all.end(),
                  [](const Cell& c) { return c.system == "pgq" || c.system == "graphile" || c.system == "river"; }),
              all.end());
  std::vector<Cell> cells = select_cells(all, o.quick, o.cells, !o.no_floors && !ab);
  // The floors do not involve relaybus: both builds would measure the same thing.
  if (ab)
    cells.erase(std::remove_if(cells.begin(), cells.end(), [](const Cell& c) { return c.system != "relaybus"; }),
                cells.end());
  if (o.list) {
    for (const Cell& c : cells) std::cout << c.name << (c.floor.empty() ? "" : "   (vs " + c.floor + ")") << "\n";
    std::cout << cells.size() << " cells\n";
    return 0;
  }
  if (cells.empty()) {
    std::cerr << "no cell matches\n";
    return 2;
  }

  std::string run_id = utc_stamp(true);
  if (o.out.empty()) o.out = o.repo + "/bench/results/" + run_id;
  mkdirs(o.out);
  signal(SIGINT, on_interrupt);
  signal(SIGTERM, on_interrupt);
  signal(SIGPIPE, SIG_IGN);
  if (ab) {
    std::cerr << "relaybus-bench A/B: " << cells.size() << " cells x " << o.pairs << " pairs, results in " << o.out
              << "\n";
    return run_ab(o, cells, run_id);
  }

  int64_t started = mono_ns();
  ReportInput in;
  in.run_id = run_id;
  in.out_dir = o.out;
  in.args = o.argv_text;
  Json env = Json::object();
  env["run_id"] = run_id;
  env["started_at"] = utc_stamp(false);
  env["args"] = o.argv_text;
  env["machine"] = machine_env();
  env["build"] = build_env(o.pg_config, o.repo);

  Runner runner(o, o.out, o.pg_config);
  int rc = 0;
  bool started_cluster = false;
  struct SkippedAll {};
  try {
    std::cerr << "relaybus-bench: " << cells.size() << " cells, results in " << o.out << "\n";
    runner.ensure_peer_deps(cells);
    in.notes = runner.skipped_peers;
    if (!runner.skipped_peers.empty()) {
      Json sk = Json::array();
      for (const std::string& n : runner.skipped_peers) sk.push(n);
      env["peers_skipped"] = sk;
    }
    if (cells.empty()) throw SkippedAll();
    started_cluster = true;  // stop_cluster also cleans up after a start that failed half-way
    runner.start_cluster(cells);
    env["postgres"] = runner.server_env();
    write_file(o.out + "/env.json", env.dump() + "\n");
    std::string samples_path = o.out + "/samples.jsonl";
    write_file(samples_path, "");
    int idx = 0;
    for (const Cell& c : cells) {
      idx++;
      for (int s = 1; s <= o.samples; s++) {
        std::cerr << strf("[%d/%zu] %s (sample %d)\n", idx, cells.size(), c.name.c_str(), s);
        for (SampleResult& r : runner.run_cell(c, s)) {
          std::cerr << "    " << one_line_summary(r) << "\n";
          for (auto& why : r.invalid) std::cerr << "    invalid: " << why << "\n";
          append_file(samples_path, r.json.dump() + "\n");
          in.samples.push_back(r);
        }
      }
    }
  } catch (const SkippedAll&) {
    // Every selected cell was a skipped peer's: no cluster, the report says why.
  } catch (const std::exception& e) {
    std::cerr << "relaybus-bench: " << e.what() << "\n";
    rc = 1;
  }
  if (started_cluster) runner.stop_cluster();
  in.minutes = double(mono_ns() - started) / 60e9;
  env["finished_at"] = utc_stamp(false);
  env["minutes"] = in.minutes;
  write_file(o.out + "/env.json", env.dump() + "\n");
  in.env = env;
  if (!in.samples.empty()) {
    std::string md = write_reports(in);
    std::cout << md;
  } else if (!in.notes.empty()) {
    // Every selected cell was a skipped peer's: the report is why.
    std::string md = "# relaybus benchmark " + run_id + "\n\n";
    for (const std::string& n : in.notes) md += n + "; its cells were skipped.\n";
    write_file(o.out + "/report.md", md);
    std::cout << md;
  }
  std::cerr << "results: " << o.out << "\n";
  return rc;
}
