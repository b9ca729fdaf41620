#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace relaybus::core {

// One route as a store reads it from its catalog.
struct RouteInput {
  int64_t handler = 0;  // the store's key for the handler (an id, or an index into its own table)
  std::string pattern;
  std::optional<std::string> wire_name;  // none: the handler sees the topic itself
};

// Which route of each handler decides an event's delivery, for every store
// (docs/sql-api.md, relay_route; docs/mongo.md). Among one handler's routes
// that match a topic, the deciding one is the first in this order:
//   1. lowest pattern_specificity (an exact topic, then fewest '*', '#' last);
//   2. the pattern text in byte order (memcmp: '#' < '*' < '-' < digits <
//      upper case < '_' < lower case, never a locale's collation);
//   3. no wire name before a wire name, then the wire name in byte order (only
//      for input holding one pattern twice for a handler, which no store does).
// The answer depends on the routes only, never on the order they are given in.
//
// Built once per catalog load; immutable afterwards, so resolve() may be called
// from several threads and the Route pointers it reports live as long as the
// resolver.
class RouteResolver {
 public:
  struct Route {
    int64_t handler;
    std::string pattern;
    std::optional<std::string> wire_name;
    int specificity;
  };
  struct Decision {
    int64_t handler;
    const Route* route;
  };

  RouteResolver() = default;
  explicit RouteResolver(std::vector<RouteInput> routes);

  // Appends one decision per handler with a route matching `topic`, in
  // ascending handler order. Topic and patterns are not validated here
  // (validate on the way in).
  void resolve(std::string_view topic, std::vector<Decision>* out) const;

  // The tie rule above for two routes of one handler: true when `a` decides over `b`.
  static bool decides_before(const Route& a, const Route& b);

  size_t route_count() const { return routes_.size(); }

 private:
  // Sorted by handler, then by decides_before: a handler's routes are one run,
  // and within it the first match decides.
  std::vector<Route> routes_;
  // Index into routes_ where each handler's run starts; a last entry routes_.size().
  std::vector<size_t> starts_;
};

}  // namespace relaybus::core
