#include "mongo/command_trace.hpp"

#include "mongo/util.hpp"

namespace relaybus::mongo {

namespace {

constexpr int64_t kSlowUs = 1000000;

void on_succeeded(const mongoc_apm_command_succeeded_t* e) {
  const int64_t us = mongoc_apm_command_succeeded_get_duration(e);
  log(us >= kSlowUs ? LogLevel::Warn : LogLevel::Debug, us >= kSlowUs ? "slow store command" : "store command",
      {{"command", mongoc_apm_command_succeeded_get_command_name(e)}, {"ms", us / 1000.0}});
}

void on_failed(const mongoc_apm_command_failed_t* e) {
  bson_error_t err;
  mongoc_apm_command_failed_get_error(e, &err);
  log_debug("store command failed", {{"command", mongoc_apm_command_failed_get_command_name(e)},
                                     {"ms", mongoc_apm_command_failed_get_duration(e) / 1000.0},
                                     {"error", err.message}});
}

}  // namespace

void install_command_trace(mongoc_client_t* client) {
  mongoc_apm_callbacks_t* cb = mongoc_apm_callbacks_new();
  mongoc_apm_set_command_succeeded_cb(cb, on_succeeded);
  mongoc_apm_set_command_failed_cb(cb, on_failed);
  mongoc_client_set_apm_callbacks(client, cb, nullptr);
  mongoc_apm_callbacks_destroy(cb);
}

}  // namespace relaybus::mongo
