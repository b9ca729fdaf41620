// A thin libpq wrapper: one connection, errors as exceptions.
#pragma once

#include <libpq-fe.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace bench {

struct PgError : std::runtime_error {
  std::string sqlstate;
  PgError(const std::string& m, const std::string& st) : std::runtime_error(m), sqlstate(st) {}
};

// A result; rows and columns by index, values as text.
class Result {
 public:
  explicit Result(PGresult* r) : r_(r, PQclear) {}
  int rows() const { return PQntuples(r_.get()); }
  int cols() const { return PQnfields(r_.get()); }
  bool null(int row, int col) const { return PQgetisnull(r_.get(), row, col) != 0; }
  const char* val(int row, int col) const { return PQgetvalue(r_.get(), row, col); }
  int len(int row, int col) const { return PQgetlength(r_.get(), row, col); }
  std::string str(int row, int col) const { return null(row, col) ? std::string() : std::string(val(row, col)); }
  long long i64(int row, int col) const { return null(row, col) ? 0 : std::stoll(val(row, col)); }
  double f64(int row, int col) const { return null(row, col) ? 0.0 : std::stod(val(row, col)); }
  const char* name(int col) const { return PQfname(r_.get(), col); }
  PGresult* get() const { return r_.get(); }

 private:
  std::shared_ptr<PGresult> r_;
};

class Conn {
 public:
  Conn() = default;
  explicit Conn(const std::string& conninfo) { connect(conninfo); }
  ~Conn() { close(); }
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  void connect(const std::string& conninfo) {
    close();
    c_ = PQconnectdb(conninfo.c_str());
    if (PQstatus(c_) != CONNECTION_OK) {
      std::string m = PQerrorMessage(c_);
      close();
      throw PgError("connect failed: " + m, "08000");
    }
    PQsetNoticeProcessor(
        c_, [](void*, const char*) {}, nullptr);
  }
  void close() {
    if (c_ != nullptr) PQfinish(c_);
    c_ = nullptr;
  }
  PGconn* raw() const { return c_; }
  int backend_pid() const { return PQbackendPID(c_); }

  // Simple query protocol (several statements allowed); last result returned.
  Result exec(const std::string& sql) { return check(PQexec(c_, sql.c_str()), sql); }

  // Extended protocol with text parameters; nullptr = SQL NULL.
  Result exec_params(const std::string& sql, const std::vector<const char*>& params) {
    return check(PQexecParams(c_, sql.c_str(), int(params.size()), nullptr, params.data(), nullptr, nullptr, 0), sql);
  }
  void prepare(const std::string& name, const std::string& sql, int nparams) {
    check(PQprepare(c_, name.c_str(), sql.c_str(), nparams, nullptr), sql);
  }
  Result exec_prepared(const std::string& name, const std::vector<const char*>& params) {
    return check(PQexecPrepared(c_, name.c_str(), int(params.size()), params.data(), nullptr, nullptr, 0), name);
  }
  std::string one(const std::string& sql) {
    Result r = exec(sql);
    return r.rows() > 0 && r.cols() > 0 ? r.str(0, 0) : std::string();
  }
  long long one_i64(const std::string& sql) {
    std::string s = one(sql);
    return s.empty() ? 0 : std::stoll(s);
  }

 private:
  Result check(PGresult* r, const std::string& what) {
    ExecStatusType st = PQresultStatus(r);
    if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK || st == PGRES_EMPTY_QUERY) return Result(r);
    std::string msg = r != nullptr ? PQresultErrorMessage(r) : PQerrorMessage(c_);
    const char* code = r != nullptr ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : nullptr;
    std::string sqlstate = code != nullptr ? code : "";
    if (r != nullptr) PQclear(r);
    std::string head = what.substr(0, 160);
    throw PgError(msg + " [in: " + head + "]", sqlstate);
  }
  PGconn* c_ = nullptr;
};

// Quote a string as an SQL literal (E'' free: standard_conforming_strings is on).
inline std::string sql_lit(const std::string& s) {
  std::string o = "'";
  for (char c : s) {
    if (c == '\'')
      o += "''";
    else
      o += c;
  }
  return o + "'";
}

// Append one element to a PostgreSQL array literal ("{...}") being built.
inline void array_append(std::string* arr, const char* v) {
  if (arr->size() > 1) *arr += ',';
  if (v == nullptr) {
    *arr += "NULL";
    return;
  }
  *arr += '"';
  for (const char* p = v; *p; p++) {
    if (*p == '"' || *p == '\\') *arr += '\\';
    *arr += *p;
  }
  *arr += '"';
}

}  // namespace bench
