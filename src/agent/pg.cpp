#include "agent/pg.hpp"

namespace relaybus::agent {

namespace {
std::string trimmed(const char* s) {
  std::string t = s == nullptr ? "" : s;
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
  return t;
}
}  // namespace

bool PgConn::connect(const std::string& conninfo, std::string* why) {
  close();
  // expand_dbname: conninfo is a URI or key=value string; the application
  // name is a fallback the conninfo may override.
  const char* keys[] = {"dbname", "fallback_application_name", nullptr};
  const char* values[] = {conninfo.c_str(), "relaybus-agent", nullptr};
  conn_ = PQconnectdbParams(keys, values, 1);
  if (conn_ == nullptr) {
    *why = "out of memory";
    return false;
  }
  if (PQstatus(conn_) != CONNECTION_OK) {
    *why = trimmed(PQerrorMessage(conn_));
    close();
    return false;
  }
  return true;
}

void PgConn::close() {
  if (conn_ != nullptr) PQfinish(conn_);
  conn_ = nullptr;
}

PgResult PgConn::exec(const std::string& sql, const std::vector<std::optional<std::string>>& params) {
  if (conn_ == nullptr) throw PgError("", "not connected", true);
  std::vector<const char*> values;
  values.reserve(params.size());
  for (const auto& p : params) values.push_back(p ? p->c_str() : nullptr);
  PGresult* r =
      PQexecParams(conn_, sql.c_str(), static_cast<int>(values.size()), nullptr, values.data(), nullptr, nullptr, 0);
  const ExecStatusType st = r == nullptr ? PGRES_FATAL_ERROR : PQresultStatus(r);
  if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) return PgResult(r);
  const char* state = r == nullptr ? nullptr : PQresultErrorField(r, PG_DIAG_SQLSTATE);
  std::string sqlstate = state == nullptr ? "" : state;
  std::string message =
      trimmed(r != nullptr && PQresultErrorMessage(r)[0] != '\0' ? PQresultErrorMessage(r) : PQerrorMessage(conn_));
  if (r != nullptr) PQclear(r);
  const bool lost = PQstatus(conn_) != CONNECTION_OK;
  if (lost) close();
  throw PgError(sqlstate, message, lost);
}

bool PgConn::poll_notifications(std::vector<std::pair<std::string, std::string>>* out) {
  if (conn_ == nullptr) return false;
  if (PQconsumeInput(conn_) == 0 || PQstatus(conn_) != CONNECTION_OK) {
    close();
    return false;
  }
  queued_notifications(out);
  return true;
}

void PgConn::queued_notifications(std::vector<std::pair<std::string, std::string>>* out) {
  if (conn_ == nullptr) return;
  while (PGnotify* n = PQnotifies(conn_)) {
    out->emplace_back(n->relname, n->extra);
    PQfreemem(n);
  }
}

std::string array_literal(const std::vector<std::optional<std::string>>& items) {
  std::string out = "{";
  for (size_t i = 0; i < items.size(); i++) {
    if (i > 0) out += ',';
    if (!items[i]) {
      out += "NULL";
      continue;
    }
    out += '"';
    for (char c : *items[i]) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    out += '"';
  }
  out += '}';
  return out;
}

}  // namespace relaybus::agent
