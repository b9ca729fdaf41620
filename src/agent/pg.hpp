#pragma once

// A libpq connection as relaybus-agent uses it: synchronous statements with
// text parameters, errors as PgError (SQLSTATE and message), and the
// notifications that arrived. One thread.

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <libpq-fe.h>

namespace relaybus::agent {

struct PgError : std::runtime_error {
  PgError(std::string sqlstate_, const std::string& message, bool connection_lost_)
      : std::runtime_error(message), sqlstate(std::move(sqlstate_)), connection_lost(connection_lost_) {}
  std::string sqlstate;  // empty: no server error (the connection broke)
  bool connection_lost;
};

class PgResult {
 public:
  explicit PgResult(PGresult* r) : r_(r, PQclear) {}
  int rows() const { return PQntuples(r_.get()); }
  bool null(int row, int col) const { return PQgetisnull(r_.get(), row, col) != 0; }
  std::string text(int row, int col) const { return PQgetvalue(r_.get(), row, col); }
  long long integer(int row, int col) const { return std::stoll(text(row, col)); }

 private:
  std::unique_ptr<PGresult, void (*)(PGresult*)> r_;
};

class PgConn {
 public:
  PgConn() = default;
  ~PgConn() { close(); }
  PgConn(const PgConn&) = delete;
  PgConn& operator=(const PgConn&) = delete;

  // Blocking connect (libpq's connect_timeout applies). False with *why.
  bool connect(const std::string& conninfo, std::string* why);
  void close();
  bool ok() const { return conn_ != nullptr && PQstatus(conn_) == CONNECTION_OK; }
  int socket() const { return conn_ == nullptr ? -1 : PQsocket(conn_); }
  PGconn* raw() const { return conn_; }

  // Runs one statement (its own transaction unless one is open). Throws
  // PgError; a broken connection is closed and says so.
  PgResult exec(const std::string& sql, const std::vector<std::optional<std::string>>& params = {});
  // Reads what the server sent; the notifications' channel and payload, in
  // order. False if the connection broke (closed).
  bool poll_notifications(std::vector<std::pair<std::string, std::string>>* out);
  // The notifications libpq already read (a statement reads those that
  // arrive while it runs: the socket then shows nothing more to read).
  void queued_notifications(std::vector<std::pair<std::string, std::string>>* out);

 private:
  PGconn* conn_ = nullptr;
};

// A PostgreSQL array literal of the texts (NULL elements as NULL).
std::string array_literal(const std::vector<std::optional<std::string>>& items);

}  // namespace relaybus::agent
