// listen_client: a real LISTEN consumer for relaybus's notify handlers, used by
// the integration tests.
//
//   listen_client [options] [CONNINFO]
//
// Connects (CONNINFO, else the PG* environment), LISTENs on --channel and, for
// each notification, prints one line to stdout (flushed):
//
//   PID <TAB> PAYLOAD-JSON [<TAB> recv=EPOCH_SECONDS] [<TAB> fetched=JSON]
//
// Options:
//   --channel NAME        channel to LISTEN on (required)
//   --count N             exit 0 after N notifications
//   --idle-timeout S      exit after S seconds (fractions allowed) without a
//                         notification: 0 without --count, 3 with --count
//   --ack                 call relay_ack(ARRAY[id], ARRAY[lease]) for every
//                         delivery (the message's "lease"; without one, the
//                         id-only relay_ack(ARRAY[id]))
//   --ack-ref             call relay_ack only for "ref": true deliveries (what a
//                         fire-mode consumer does after fetching the payload)
//   --claim-at-start H    after LISTEN (and after every reconnect), drain
//                         handler H once with relay_claim (what a restarted
//                         consumer of an ack-mode notify handler does); each
//                         claimed delivery is printed as a line with PID 0
//                         and "claimed": true, and acked with its lease
//                         under --ack
//   --ack-skip N          with --ack/--ack-ref: do not ack the first N notifications
//   --fetch-ref           for "ref": true deliveries, call relay_payload(id)
//                         (before acking) and append fetched=<json>
//   --timestamps          append recv=<epoch seconds> (microsecond precision)
//   --ready-file PATH     create PATH once LISTEN is in effect
//   --reconnect S         on a lost connection, try to reconnect (and LISTEN
//                         again) for up to S seconds instead of exiting 2
//
// stderr gets diagnostics (ack errors, reconnects). Exit codes: 0 done, 1 usage
// or setup error, 2 connection lost, 3 idle timeout before --count.

#include <libpq-fe.h>
#include <sys/select.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

struct Options {
  std::string conninfo;
  std::string channel;
  long count = -1;
  double idle_timeout = -1;
  bool ack = false;
  bool ack_ref = false;
  long ack_skip = 0;
  bool fetch_ref = false;
  bool timestamps = false;
  std::string ready_file;
  double reconnect = -1;
  std::string claim_handler;
};

double now_seconds() {
  struct timeval tv;
  gettimeofday(&tv, nullptr);
  return static_cast<double>(tv.tv_sec) + static_cast<double>(tv.tv_usec) / 1e6;
}

[[noreturn]] void usage(const char* msg) {
  if (msg != nullptr) fprintf(stderr, "listen_client: %s\n", msg);
  fprintf(stderr,
          "usage: listen_client --channel NAME [--count N] [--idle-timeout S] [--ack] [--ack-ref] [--ack-skip N]\n"
          "                     [--fetch-ref] [--timestamps] [--ready-file PATH] [--reconnect S]\n"
          "                     [--claim-at-start HANDLER] [CONNINFO]\n");
  exit(1);
}

// ---- a tiny JSON scanner: finds top-level members of an object -------------

size_t skip_ws(const std::string& s, size_t i) {
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
  return i;
}

// s[i] == '"': returns the index after the closing quote, the raw contents in *out.
size_t scan_string(const std::string& s, size_t i, std::string* out) {
  size_t j = i + 1;
  while (j < s.size() && s[j] != '"') {
    if (s[j] == '\\') j++;
    j++;
  }
  if (out != nullptr) *out = s.substr(i + 1, j - i - 1);
  return j + 1;
}

// Skips one JSON value starting at s[i]; returns the index after it.
size_t skip_value(const std::string& s, size_t i) {
  i = skip_ws(s, i);
  if (i >= s.size()) return i;
  if (s[i] == '"') return scan_string(s, i, nullptr);
  if (s[i] == '{' || s[i] == '[') {
    int depth = 0;
    while (i < s.size()) {
      char c = s[i];
      if (c == '"') {
        i = scan_string(s, i, nullptr);
        continue;
      }
      if (c == '{' || c == '[') depth++;
      if (c == '}' || c == ']') {
        depth--;
        if (depth == 0) return i + 1;
      }
      i++;
    }
    return i;
  }
  while (i < s.size() && s[i] != ',' && s[i] != '}' && s[i] != ']' && s[i] != ' ') i++;
  return i;
}

// The raw text of the top-level member `name` of the JSON object `s`.
bool top_level_member(const std::string& s, const char* name, std::string* raw) {
  size_t i = skip_ws(s, 0);
  if (i >= s.size() || s[i] != '{') return false;
  i++;
  for (;;) {
    i = skip_ws(s, i);
    if (i >= s.size() || s[i] == '}') return false;
    if (s[i] != '"') return false;
    std::string key;
    i = scan_string(s, i, &key);
    i = skip_ws(s, i);
    if (i >= s.size() || s[i] != ':') return false;
    i = skip_ws(s, i + 1);
    size_t end = skip_value(s, i);
    if (key == name) {
      *raw = s.substr(i, end - i);
      return true;
    }
    i = skip_ws(s, end);
    if (i < s.size() && s[i] == ',') i++;
  }
}

// ---- connection ----------------------------------------------------------------

PGconn* conn = nullptr;

bool connect_and_listen(const Options& o, bool quiet) {
  if (conn != nullptr) PQfinish(conn);
  conn = PQconnectdb(o.conninfo.c_str());
  if (PQstatus(conn) != CONNECTION_OK) {
    if (!quiet) fprintf(stderr, "listen_client: connection failed: %s", PQerrorMessage(conn));
    return false;
  }
  char* ident = PQescapeIdentifier(conn, o.channel.c_str(), o.channel.size());
  std::string sql = std::string("LISTEN ") + ident;
  PQfreemem(ident);
  PGresult* r = PQexec(conn, sql.c_str());
  bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
  if (!ok) fprintf(stderr, "listen_client: LISTEN failed: %s", PQerrorMessage(conn));
  PQclear(r);
  return ok;
}

bool connection_lost() { return conn == nullptr || PQstatus(conn) == CONNECTION_BAD; }

// Reconnects within o.reconnect seconds; false if it could not (or must not).
bool reconnect(const Options& o) {
  if (o.reconnect < 0) return false;
  double deadline = now_seconds() + o.reconnect;
  fprintf(stderr, "listen_client: connection lost, reconnecting\n");
  while (now_seconds() < deadline) {
    if (connect_and_listen(o, true)) {
      fprintf(stderr, "listen_client: reconnected (backend pid %d)\n", PQbackendPID(conn));
      return true;
    }
    usleep(200 * 1000);
  }
  fprintf(stderr, "listen_client: could not reconnect within %.1f s: %s", o.reconnect,
          conn != nullptr ? PQerrorMessage(conn) : "\n");
  return false;
}

// Runs a query with one or two parameters; returns the result (caller clears) or nullptr on error.
PGresult* exec1(const char* sql, const std::string& param, const char* what, const std::string* param2 = nullptr) {
  const char* values[2] = {param.c_str(), param2 != nullptr ? param2->c_str() : nullptr};
  PGresult* r = PQexecParams(conn, sql, param2 != nullptr ? 2 : 1, nullptr, values, nullptr, nullptr, 0);
  if (PQresultStatus(r) != PGRES_TUPLES_OK) {
    fprintf(stderr, "listen_client: %s %s failed: %s", what, param.c_str(), PQerrorMessage(conn));
    PQclear(r);
    return nullptr;
  }
  return r;
}

// --claim-at-start: drains the handler once with relay_claim (printing each
// delivery as a line with PID 0 and "claimed": true, acking it under --ack).
bool claim_pending(const Options& o, long* received) {
  if (o.claim_handler.empty()) return true;
  PGresult* r = exec1(
      "SELECT jsonb_build_object('id', c.id, 'event_id', c.event_id, 'topic', c.topic, 'key', c.key,"
      " 'seq', c.seq, 'attempt', c.attempt, 'headers', c.headers, 'payload', c.payload,"
      " 'lease', c.lease, 'claimed', true)::text, c.id::text, c.lease::text"
      " FROM relay_claim($1, 10000) c",
      o.claim_handler, "relay_claim");
  if (r == nullptr) return false;
  for (int i = 0; i < PQntuples(r); i++) {
    (*received)++;
    printf("0\t%s", PQgetvalue(r, i, 0));
    if (o.timestamps) printf("\trecv=%.6f", now_seconds());
    printf("\n");
    fflush(stdout);
    if (o.ack) {
      std::string id = PQgetvalue(r, i, 1), lease = PQgetvalue(r, i, 2);
      PGresult* a = exec1("SELECT relay_ack(ARRAY[$1::bigint], ARRAY[$2::uuid])", id, "relay_ack", &lease);
      if (a != nullptr) PQclear(a);
    }
  }
  PQclear(r);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) usage(("missing value for " + a).c_str());
      return argv[++i];
    };
    if (a == "--channel")
      o.channel = next();
    else if (a == "--count")
      o.count = atol(next());
    else if (a == "--idle-timeout")
      o.idle_timeout = atof(next());
    else if (a == "--ack")
      o.ack = true;
    else if (a == "--ack-ref")
      o.ack_ref = true;
    else if (a == "--ack-skip")
      o.ack_skip = atol(next());
    else if (a == "--fetch-ref")
      o.fetch_ref = true;
    else if (a == "--timestamps")
      o.timestamps = true;
    else if (a == "--ready-file")
      o.ready_file = next();
    else if (a == "--reconnect")
      o.reconnect = atof(next());
    else if (a == "--claim-at-start")
      o.claim_handler = next();
    else if (a == "--help" || a == "-h")
      usage(nullptr);
    else if (!a.empty() && a[0] == '-')
      usage(("unknown option " + a).c_str());
    else
      o.conninfo = a;
  }
  if (o.channel.empty()) usage("--channel is required");

  if (!connect_and_listen(o, false)) return 1;
  if (!o.ready_file.empty()) {
    FILE* f = fopen(o.ready_file.c_str(), "w");
    if (f == nullptr) {
      fprintf(stderr, "listen_client: cannot create %s: %s\n", o.ready_file.c_str(), strerror(errno));
      return 1;
    }
    fprintf(f, "%d\n", PQbackendPID(conn));
    fclose(f);
  }

  long received = 0;
  double last = now_seconds();
  // Deliveries NOTIFYed before this consumer listened (or to a consumer that
  // died, or while it was reconnecting) are claimed right after LISTEN: no
  // waiting for their leases.
  if (!claim_pending(o, &received)) return 1;
  for (;;) {
    // Drain what libpq already has (also what arrived during an ack).
    PGnotify* n;
    while ((n = PQnotifies(conn)) != nullptr) {
      double at = now_seconds();
      std::string payload = n->extra;
      int pid = n->be_pid;
      PQfreemem(n);
      received++;
      last = at;
      std::string id, ref, fetched, lease;
      bool has_id = top_level_member(payload, "id", &id);
      bool has_lease = top_level_member(payload, "lease", &lease) && lease.size() >= 2 && lease[0] == '"';
      if (has_lease) lease = lease.substr(1, lease.size() - 2);
      bool is_ref = top_level_member(payload, "ref", &ref) && ref == "true";
      if (is_ref && o.fetch_ref && has_id) {
        PGresult* r = exec1("SELECT relay_payload($1::bigint)::text", id, "relay_payload");
        if (r != nullptr) {
          fetched = PQgetisnull(r, 0, 0) ? "null" : PQgetvalue(r, 0, 0);
          PQclear(r);
        }
      }
      printf("%d\t%s", pid, payload.c_str());
      if (o.timestamps) printf("\trecv=%.6f", at);
      if (is_ref && o.fetch_ref) printf("\tfetched=%s", fetched.empty() ? "ERROR" : fetched.c_str());
      printf("\n");
      fflush(stdout);
      if ((o.ack || (o.ack_ref && is_ref)) && received > o.ack_skip) {
        if (!has_id) {
          fprintf(stderr, "listen_client: no \"id\" in %s\n", payload.c_str());
        } else {
          PGresult* r = has_lease
                            ? exec1("SELECT relay_ack(ARRAY[$1::bigint], ARRAY[$2::uuid])", id, "relay_ack", &lease)
                            : exec1("SELECT relay_ack(ARRAY[$1::bigint])", id, "relay_ack");
          if (r != nullptr) PQclear(r);
        }
      }
      if (o.count >= 0 && received >= o.count) {
        PQfinish(conn);
        return 0;
      }
      if (connection_lost()) break;
    }
    if (connection_lost()) {
      if (!reconnect(o)) return 2;
      claim_pending(o, &received);  // a failed claim is reported on stderr
      continue;
    }

    int sock = PQsocket(conn);
    fd_set rfds;
    FD_ZERO(&rfds);
    FD_SET(sock, &rfds);
    struct timeval tv;
    struct timeval* tvp = nullptr;
    if (o.idle_timeout >= 0) {
      double left = last + o.idle_timeout - now_seconds();
      if (left <= 0) {
        PQfinish(conn);
        return o.count >= 0 ? 3 : 0;
      }
      tv.tv_sec = static_cast<long>(left);
      tv.tv_usec = static_cast<long>((left - static_cast<double>(tv.tv_sec)) * 1e6);
      tvp = &tv;
    }
    int rc = select(sock + 1, &rfds, nullptr, nullptr, tvp);
    if (rc < 0) {
      if (errno == EINTR) continue;
      fprintf(stderr, "listen_client: select: %s\n", strerror(errno));
      return 1;
    }
    if (rc > 0 && !PQconsumeInput(conn)) {
      fprintf(stderr, "listen_client: %s", PQerrorMessage(conn));
      if (!reconnect(o)) return 2;
      claim_pending(o, &received);
    }
  }
}
