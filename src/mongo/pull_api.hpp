// Pull handlers over the sidecar's HTTP API (docs/mongo.md, "Pull handlers"):
//
//   POST /v1/handlers/<name>/claim   {"max": 10, "lease": "30s", "per_key": 1}
//   POST /v1/handlers/<name>/ack     {"ids": [..], "leases": [..]}
//   POST /v1/handlers/<name>/nack    {"id": N, "lease": "..", "delay": "5s", "error": ".."}
//   POST /v1/handlers/<name>/extend  {"id": N, "lease": "..", "by": "30s"}
//
// with "Authorization: Bearer <api_token>". A claim hands out deliveries of
// the lanes this instance holds, planned like PostgreSQL's relay_claim (a
// key's next delivery waits while an earlier one is leased), each with a
// lease: an unguessable token kept in this process (nothing is written to
// claim). A completion names (id, lease); a lease that is unknown, of another
// delivery, ran out, or whose lane this instance no longer holds since the
// claim is refused with 409 and changes nothing. A lease that runs out counts
// as a failed attempt ("lease expired", the handler's backoff).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "mongo/lane_claim.hpp"
#include "mongo/metrics.hpp"
#include "mongo/store.hpp"

namespace relaybus::mongo {

// What the pull API needs from the dispatcher: the catalog and the lanes.
class PullHost {
 public:
  virtual ~PullHost() = default;
  virtual const HandlerDoc* pull_handler(const std::string& name) const = 0;
  // Lanes a claim may read now, each with the epoch since which it is held.
  virtual std::vector<std::pair<int, int64_t>> claimable_lanes(int64_t now_ms) const = 0;
  // The lane is still held since that epoch, with the lease margin ahead.
  virtual bool lane_holds(int lane, int64_t since_epoch, int64_t now_ms) const = 0;
};

struct ApiResponse {
  int status = 200;
  std::string body;  // JSON
};

class PullApi {
 public:
  PullApi(Store& store, Metrics& metrics, const PullHost& host, uint64_t seed);
  // method, path, the Authorization header's value, body. token: the
  // configured api_token ("" = the API is off).
  ApiResponse handle(const std::string& method, const std::string& path, const std::string& authorization,
                     const std::string& body, const std::string& token, int64_t scan_window, int64_t priority_aging_ms);
  // Leases that ran out become failed attempts (one store write when any).
  void expire(int64_t now_ms);
  // Lanes with leased deliveries (not given back while a consumer works).
  void for_each_lane(const std::function<void(int)>& f) const;
  size_t leased() const { return leases_.size(); }
  std::map<std::string, int64_t> leased_by_handler() const;

 private:
  struct Lease {
    std::string token;
    std::string handler;
    int lane = 0;
    int64_t since_epoch = 0;
    int64_t until_ms = 0;
    int attempt = 0;  // failed attempts before this one
    bool has_key = false;
    std::string key;
    int64_t published_ms = 0;
  };
  ApiResponse claim(const HandlerDoc& h, const std::string& body, int64_t window, int64_t aging_ms);
  ApiResponse ack(const HandlerDoc& h, const std::string& body);
  ApiResponse nack(const HandlerDoc& h, const std::string& body);
  ApiResponse extend(const HandlerDoc& h, const std::string& body);
  // The lease of id named by token, or a 409 reason.
  const Lease* check(const HandlerDoc& h, int64_t id, const std::string& token, int64_t now_ms, std::string* why) const;
  std::string new_token();

  Store& store_;
  Metrics& metrics_;
  const PullHost& host_;
  std::mt19937_64 rng_;
  std::map<int64_t, Lease> leases_;  // delivery id -> its lease
  LaneClaimer claimer_;
};

}  // namespace relaybus::mongo
