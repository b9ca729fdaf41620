// The fast local HTTP receiver of the http cells: Debian's nginx, one worker,
// `return 200;` on loopback, keep-alive without a request limit, logging every
// request's webhook-id to an access log the harness reads for counts and the
// exactness check. The relaybus cells and their wrk floor use the same nginx
// with the same logging, so their ratio compares like with like.
#pragma once

#include <string>

namespace bench {

class NginxReceiver {
 public:
  // Starts nginx with a private prefix under dir on a free loopback port; throws on failure.
  void start(const std::string& dir);
  void stop();
  bool running() const { return pid_ > 0; }
  int port() const { return port_; }
  int pid() const { return pid_; }
  std::string url() const;  // http://127.0.0.1:<port>/hook
  std::string log_path() const { return dir_ + "/logs/requests.log"; }
  void truncate_log();  // before a sample (flushes first)
  void flush_log();     // SIGUSR1: nginx reopens its logs, which writes the buffers out

 private:
  std::string dir_;
  int port_ = 0;
  int pid_ = 0;
};

// Where the run's receiver keeps its prefix (set once by the harness).
void set_http_receiver_dir(const std::string& dir);
// The run's receiver, started on first use.
NginxReceiver& http_receiver();
// Stops it if it runs (end of run, interrupt).
void stop_http_receiver();

}  // namespace bench
