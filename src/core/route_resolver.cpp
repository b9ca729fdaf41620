#include "core/route_resolver.hpp"

#include <algorithm>
#include <tuple>
#include <utility>

#include "core/topic.hpp"

namespace relaybus::core {

bool RouteResolver::decides_before(const Route& a, const Route& b) {
  // std::string and std::optional compare bytewise (char_traits<char>::compare
  // is memcmp order), and an empty optional sorts first.
  return std::tie(a.specificity, a.pattern, a.wire_name) < std::tie(b.specificity, b.pattern, b.wire_name);
}

RouteResolver::RouteResolver(std::vector<RouteInput> routes) {
  routes_.reserve(routes.size());
  for (RouteInput& r : routes) {
    const int specificity = pattern_specificity(r.pattern);
    routes_.push_back(Route{r.handler, std::move(r.pattern), std::move(r.wire_name), specificity});
  }
  std::sort(routes_.begin(), routes_.end(), [](const Route& a, const Route& b) {
    if (a.handler != b.handler) return a.handler < b.handler;
    return decides_before(a, b);
  });
  for (size_t i = 0; i < routes_.size(); i++)
    if (i == 0 || routes_[i].handler != routes_[i - 1].handler) starts_.push_back(i);
  starts_.push_back(routes_.size());
}

void RouteResolver::resolve(std::string_view topic, std::vector<Decision>* out) const {
  for (size_t g = 0; g + 1 < starts_.size(); g++) {
    for (size_t i = starts_[g]; i < starts_[g + 1]; i++) {
      if (topic_matches(routes_[i].pattern, topic)) {
        out->push_back(Decision{routes_[i].handler, &routes_[i]});
        break;
      }
    }
  }
}

}  // namespace relaybus::core
