#include "receiver.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <stdexcept>

#include "util.hpp"

namespace bench {

namespace {

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw std::runtime_error("no free port");
  int port = ntohs(a.sin_port);
  close(fd);
  return port;
}

bool can_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(uint16_t(port));
  bool ok = fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  if (fd >= 0) close(fd);
  return ok;
}

NginxReceiver g_receiver;
std::string g_receiver_dir = "/tmp";

}  // namespace

void NginxReceiver::start(const std::string& dir) {
  dir_ = dir + "/nginx";
  run_capture("mkdir -p '" + dir_ + "/logs'");
  port_ = free_port();
  // One worker (so the log's line order is the order requests were served),
  // buffered logging as a production receiver would have it.
  std::string conf = strf(
      "worker_processes 1;\n"
      "pid %s/nginx.pid;\n"
      "error_log %s/logs/error.log warn;\n"
      "events { worker_connections 4096; }\n"
      "http {\n"
      "    client_body_temp_path %s/body;\n"
      "    proxy_temp_path %s/proxy;\n"
      "    fastcgi_temp_path %s/fastcgi;\n"
      "    uwsgi_temp_path %s/uwsgi;\n"
      "    scgi_temp_path %s/scgi;\n"
      "    log_format ids '$msec $http_webhook_id $status';\n"
      "    access_log %s ids buffer=256k flush=1s;\n"
      "    keepalive_requests 10000000;\n"
      "    keepalive_timeout 300s;\n"
      "    client_body_buffer_size 64k;\n"
      "    server {\n"
      "        listen 127.0.0.1:%d;\n"
      "        location / { return 200; }\n"
      "    }\n"
      "}\n",
      dir_.c_str(), dir_.c_str(), dir_.c_str(), dir_.c_str(), dir_.c_str(), dir_.c_str(), dir_.c_str(),
      log_path().c_str(), port_);
  if (geteuid() == 0) conf = "user root;\n" + conf;  // the log and temp dirs are root's
  write_file(dir_ + "/nginx.conf", conf);
  int st = 0;
  std::string out =
      run_capture("nginx -p '" + dir_ + "' -c '" + dir_ + "/nginx.conf' -e '" + dir_ + "/logs/error.log' 2>&1", &st);
  if (st != 0) throw std::runtime_error("nginx did not start: " + out);
  for (int i = 0; i < 100 && !can_connect(port_); i++) sleep_ms(50);
  pid_ = atoi(read_file(dir_ + "/nginx.pid").c_str());
  if (pid_ <= 0 || !can_connect(port_))
    throw std::runtime_error("nginx did not start listening on port " + std::to_string(port_));
}

void NginxReceiver::stop() {
  if (pid_ <= 0) return;
  kill(pid_, SIGQUIT);  // graceful; the workers flush their logs
  for (int i = 0; i < 100 && kill(pid_, 0) == 0; i++) sleep_ms(20);
  if (kill(pid_, 0) == 0) kill(pid_, SIGKILL);
  pid_ = 0;
}

std::string NginxReceiver::url() const { return strf("http://127.0.0.1:%d/hook", port_); }

void NginxReceiver::flush_log() {
  if (pid_ > 0) kill(pid_, SIGUSR1);
  sleep_ms(300);
}

void NginxReceiver::truncate_log() {
  flush_log();
  (void)!truncate(log_path().c_str(), 0);
}

void set_http_receiver_dir(const std::string& dir) { g_receiver_dir = dir; }

NginxReceiver& http_receiver() {
  if (!g_receiver.running()) g_receiver.start(g_receiver_dir);
  return g_receiver;
}

void stop_http_receiver() { g_receiver.stop(); }

}  // namespace bench
