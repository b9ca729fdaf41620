// HttpEngine over TLS against a real HTTP/2 server on loopback: nghttpd
// (Debian package nghttp2-server) with a throwaway self-signed certificate
// made by the openssl command. Skipped when either program is missing.

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "core/http_engine.hpp"
#include "http_loop.hpp"
#include "test_http_server.hpp"

namespace relaybus::core {
namespace {

bool have_program(const std::string& name) {
  return std::system(("command -v " + name + " >/dev/null 2>&1").c_str()) == 0;
}

bool port_open(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sin.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&sin), sizeof sin) == 0;
  close(fd);
  return ok;
}

class HttpEngineTls : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!have_program("nghttpd") || !have_program("openssl")) {
      skip_reason_ = "nghttpd (nghttp2-server) or openssl is not installed";
      return;
    }
    char tmpl[] = "/tmp/relaybus_tls_XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      skip_reason_ = "mkdtemp failed";
      return;
    }
    dir_ = tmpl;
    const std::string gen =
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
        "-subj /CN=localhost -addext subjectAltName=DNS:localhost -keyout '" +
        dir_ + "/key.pem' -out '" + dir_ + "/cert.pem' >/dev/null 2>&1";
    if (std::system(gen.c_str()) != 0) {
      skip_reason_ = "openssl could not make a certificate";
      return;
    }
    std::system(("mkdir -p '" + dir_ + "/www'").c_str());
    std::ofstream(dir_ + "/www/hook") << "hi\n";
    port_ = testing::closed_loopback_port();
    pid_ = fork();
    if (pid_ == 0) {
      int null = open("/dev/null", O_WRONLY);
      dup2(null, 1);
      dup2(null, 2);
      const std::string port = std::to_string(port_), key = dir_ + "/key.pem", cert = dir_ + "/cert.pem",
                        www = dir_ + "/www";
      execlp("nghttpd", "nghttpd", "-a", "127.0.0.1", "-d", www.c_str(), port.c_str(), key.c_str(), cert.c_str(),
             static_cast<char*>(nullptr));
      _exit(127);
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!port_open(port_) && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (!port_open(port_)) skip_reason_ = "nghttpd did not start";
  }

  static void TearDownTestSuite() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
    if (!dir_.empty()) std::system(("rm -rf '" + dir_ + "'").c_str());
  }

  void SetUp() override {
    if (!skip_reason_.empty()) FAIL() << skip_reason_;
  }

  static HttpEngineOptions options(bool with_ca) {
    HttpEngineOptions o;
    std::string why;
    EXPECT_TRUE(parse_allowlist("localhost,127.0.0.0/8", &o.allow, &why)) << why;
    if (with_ca) o.ca_file = dir_ + "/cert.pem";
    return o;
  }

  static HttpRequest post(const std::string& path, uint64_t tag = 1) {
    HttpRequest r;
    r.tag = tag;
    r.handler_key = 1;
    r.url = "https://localhost:" + std::to_string(port_) + path;
    r.body = R"({"x":1})";
    r.timeout_ms = 5000;
    return r;
  }

  static HttpResult one(HttpEngine& e, HttpRequest r) {
    std::vector<HttpRequest> v{std::move(r)};
    auto res = testing::http_loop_deliver(e, std::move(v));
    EXPECT_EQ(res.size(), 1u);
    if (res.empty()) return HttpResult{};
    return res[0];
  }

  static inline std::string skip_reason_;
  static inline std::string dir_;
  static inline int port_ = 0;
  static inline pid_t pid_ = -1;
};

TEST_F(HttpEngineTls, UsesHttp2WhenTheServerOffersIt) {
  HttpEngine engine(options(true));
  const HttpResult r = one(engine, post("/hook"));
  EXPECT_EQ(r.outcome, HttpOutcome::Success) << r.error;
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.http_version, 20);
  EXPECT_EQ(r.body, "hi\n");
  const HttpResult missing = one(engine, post("/missing"));
  EXPECT_EQ(missing.outcome, HttpOutcome::Fail);
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(missing.http_version, 20);
}

TEST_F(HttpEngineTls, ConcurrentRequestsMultiplex) {
  HttpEngine engine(options(true));
  engine.set_handler_limit(1, 16);
  std::vector<HttpRequest> reqs;
  for (uint64_t i = 0; i < 40; ++i) reqs.push_back(post("/hook", i));
  const auto results = testing::http_loop_deliver(engine, reqs);
  ASSERT_EQ(results.size(), 40u);
  int connections = 0;
  for (const auto& r : results) {
    EXPECT_EQ(r.outcome, HttpOutcome::Success) << r.error;
    EXPECT_EQ(r.http_version, 20);
    connections += r.new_connections;
  }
  EXPECT_EQ(connections, 1);  // one HTTP/2 connection carried all 40
}

TEST_F(HttpEngineTls, AnUntrustedCertificateIsRefusedAndRetried) {
  HttpEngine engine(options(false));  // the system trust store does not know it
  const HttpResult r = one(engine, post("/hook"));
  EXPECT_EQ(r.outcome, HttpOutcome::Retry);
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.error.rfind("TLS: ", 0), 0u) << r.error;
}

TEST_F(HttpEngineTls, VerificationCanBeTurnedOff) {
  HttpEngineOptions o = options(false);
  o.verify_tls = false;
  HttpEngine engine(o);
  const HttpResult r = one(engine, post("/hook"));
  EXPECT_EQ(r.outcome, HttpOutcome::Success) << r.error;
}

TEST_F(HttpEngineTls, TheNameIsVerified) {
  // The certificate names localhost only: the same server reached as
  // 127.0.0.1 does not prove its identity.
  HttpEngine engine(options(true));
  HttpRequest r = post("/hook");
  r.url = "https://127.0.0.1:" + std::to_string(port_) + "/hook";
  const HttpResult by_ip = one(engine, r);
  EXPECT_EQ(by_ip.outcome, HttpOutcome::Retry);
  EXPECT_EQ(by_ip.error.rfind("TLS: ", 0), 0u) << by_ip.error;
  EXPECT_EQ(one(engine, post("/hook")).outcome, HttpOutcome::Success);
}

}  // namespace
}  // namespace relaybus::core
