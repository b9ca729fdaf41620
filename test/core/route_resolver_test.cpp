#include "core/route_resolver.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace relaybus::core {
namespace {

RouteInput route(int64_t handler, std::string pattern, std::optional<std::string> wire = std::nullopt) {
  return RouteInput{handler, std::move(pattern), std::move(wire)};
}

// "handler=wire ..." in handler order, "-" for no wire name.
std::string resolve_text(const RouteResolver& r, std::string_view topic) {
  std::vector<RouteResolver::Decision> out;
  r.resolve(topic, &out);
  std::string s;
  for (const auto& d : out) {
    if (!s.empty()) s += ' ';
    s += std::to_string(d.handler) + "=" + d.route->wire_name.value_or("-");
  }
  return s;
}

TEST(RouteResolver, SpecificityTieGoesToThePatternFirstInByteOrder) {
  // a.* and *.b both have specificity 2 for a.b; '*' (0x2a) < 'a'.
  RouteResolver r({route(1, "a.*", "w1"), route(1, "*.b", "w2")});
  EXPECT_EQ(resolve_text(r, "a.b"), "1=w2");
  EXPECT_EQ(resolve_text(r, "a.c"), "1=w1");
  EXPECT_EQ(resolve_text(r, "x.b"), "1=w2");
}

TEST(RouteResolver, ByteOrderIsNotALocaleCollation) {
  // 'Z' (0x5a) < '_' (0x5f) < 'a' (0x61); a locale would put a before Z.
  RouteResolver r(
      {route(1, "#.a.#", "lower"), route(1, "#.Z.#", "upper"), route(2, "#._.#", "under"), route(2, "#.a.#", "lower")});
  EXPECT_EQ(resolve_text(r, "Z.a"), "1=upper 2=lower");
  EXPECT_EQ(resolve_text(r, "a._"), "1=lower 2=under");
}

TEST(RouteResolver, TheDecidingRouteMayHaveNoWireName) {
  RouteResolver r({route(1, "*.b", "w"), route(1, "a.*")});
  EXPECT_EQ(resolve_text(r, "a.b"), "1=w");
  RouteResolver s({route(1, "*.b"), route(1, "a.*", "w")});
  EXPECT_EQ(resolve_text(s, "a.b"), "1=-");
}

TEST(RouteResolver, OneStarBeatsHashAndHashTiesByText) {
  RouteResolver r({route(1, "a.#", "hash"), route(1, "a.*.*.*", "stars"), route(1, "#", "all")});
  EXPECT_EQ(resolve_text(r, "a.b.c.d"), "1=stars");  // 4 < 101
  EXPECT_EQ(resolve_text(r, "a.b"), "1=all");        // a.# and # both 101; '#' < 'a'
  EXPECT_EQ(resolve_text(r, "b"), "1=all");
}

TEST(RouteResolver, ExactTopicBeatsEveryPattern) {
  RouteResolver r({route(1, "#", "all"), route(1, "*.*", "two"), route(1, "a.b", "exact"), route(1, "a.*", "one")});
  EXPECT_EQ(resolve_text(r, "a.b"), "1=exact");
  EXPECT_EQ(resolve_text(r, "a.c"), "1=one");
  EXPECT_EQ(resolve_text(r, "b.c"), "1=two");
}

TEST(RouteResolver, NoMatchNoDecision) {
  RouteResolver r({route(1, "a.*", "w"), route(2, "b.#")});
  EXPECT_EQ(resolve_text(r, "c"), "");
  EXPECT_EQ(resolve_text(r, "a"), "");  // '*' is exactly one segment
  EXPECT_EQ(resolve_text(r, "b"), "2=-");
  EXPECT_EQ(resolve_text(RouteResolver(), "a"), "");
  EXPECT_EQ(RouteResolver().route_count(), 0u);
}

TEST(RouteResolver, OneDecisionPerHandlerInHandlerOrder) {
  RouteResolver r({route(30, "#", "c"), route(-5, "a.b", "a"), route(7, "a.*", "b"), route(7, "a.#", "b2")});
  EXPECT_EQ(resolve_text(r, "a.b"), "-5=a 7=b 30=c");
  std::vector<RouteResolver::Decision> out{{99, nullptr}};
  r.resolve("x", &out);
  ASSERT_EQ(out.size(), 2u) << "resolve appends";
  EXPECT_EQ(out[1].handler, 30);
  EXPECT_EQ(out[1].route->pattern, "#");
}

TEST(RouteResolver, SamePatternTwiceIsStillDecidedByTheRoutesAlone) {
  RouteResolver r({route(1, "a.*", "y"), route(1, "a.*", "x"), route(1, "a.*")});
  EXPECT_EQ(resolve_text(r, "a.b"), "1=-");
  RouteResolver s({route(1, "a.*", "y"), route(1, "a.*", "x")});
  EXPECT_EQ(resolve_text(s, "a.b"), "1=x");
}

// test/vectors/routes.tsv, the table both stores' integration tests assert.
struct Vectors {
  std::vector<RouteInput> routes;
  std::vector<std::pair<std::string, std::string>> expect;  // topic, "name=wire ..."
  std::vector<std::string> names;                           // handler key = index, sorted
};

Vectors read_vectors() {
  const char* env = std::getenv("RELAYBUS_VECTORS_DIR");
  const std::string path = std::string(env && *env ? env : "test/vectors") + "/routes.tsv";
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path << " (set RELAYBUS_VECTORS_DIR)";
  std::vector<std::vector<std::string>> rows;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> f;
    std::stringstream ss(line);
    for (std::string cell; std::getline(ss, cell, '\t');) f.push_back(cell);
    rows.push_back(f);
  }
  Vectors v;
  for (const auto& f : rows)
    if (f.size() == 4 && f[0] == "route") v.names.push_back(f[1]);
  std::sort(v.names.begin(), v.names.end());
  v.names.erase(std::unique(v.names.begin(), v.names.end()), v.names.end());
  for (const auto& f : rows) {
    if (f.size() == 4 && f[0] == "route") {
      const int64_t h = std::lower_bound(v.names.begin(), v.names.end(), f[1]) - v.names.begin();
      v.routes.push_back(route(h, f[2], f[3] == "-" ? std::nullopt : std::optional<std::string>(f[3])));
    } else if (f.size() == 3 && f[0] == "expect") {
      v.expect.emplace_back(f[1], f[2]);
    } else {
      ADD_FAILURE() << "bad row in " << path << ": " << f[0];
    }
  }
  return v;
}

std::string resolve_named(const RouteResolver& r, const std::vector<std::string>& names, std::string_view topic) {
  std::vector<RouteResolver::Decision> out;
  r.resolve(topic, &out);
  std::string s;
  for (const auto& d : out) {
    if (!s.empty()) s += ' ';
    s += names[d.handler] + "=" + d.route->wire_name.value_or("-");
  }
  return s;
}

TEST(RouteResolver, SharedVectors) {
  const Vectors v = read_vectors();
  ASSERT_GE(v.routes.size(), 10u);
  ASSERT_GE(v.expect.size(), 5u);
  RouteResolver r(v.routes);
  EXPECT_EQ(r.route_count(), v.routes.size());
  for (const auto& [topic, want] : v.expect) EXPECT_EQ(resolve_named(r, v.names, topic), want) << topic;
}

TEST(RouteResolver, AnswerDoesNotDependOnInputOrder) {
  const Vectors v = read_vectors();
  ASSERT_FALSE(v.routes.empty());
  std::mt19937 rng(24);
  std::vector<RouteInput> shuffled = v.routes;
  std::reverse(shuffled.begin(), shuffled.end());
  for (int round = 0; round < 50; round++) {
    RouteResolver r(shuffled);
    for (const auto& [topic, want] : v.expect)
      ASSERT_EQ(resolve_named(r, v.names, topic), want) << topic << " in round " << round;
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
  }
}

}  // namespace
}  // namespace relaybus::core
