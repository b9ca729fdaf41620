#include "core/topic.hpp"

#include <gtest/gtest.h>

#include <string>

namespace relaybus::core {
namespace {

std::string topic_why(std::string_view t) {
  std::string why;
  EXPECT_FALSE(is_valid_topic(t, &why)) << t;
  return why;
}

std::string pattern_why(std::string_view p) {
  std::string why;
  EXPECT_FALSE(is_valid_pattern(p, &why)) << p;
  return why;
}

TEST(Topic, ValidTopics) {
  for (const char* t :
       {"a", "order", "order.created", "Order_1.created-v2.x", "a.b.c.d.e", "0", "-", "_", "a-b_c.D-9"}) {
    std::string why = "untouched";
    EXPECT_TRUE(is_valid_topic(t, &why)) << t << ": " << why;
    EXPECT_EQ(why, "untouched") << "why must not be written on success";
  }
}

TEST(Topic, LengthLimitIs255Bytes) {
  const std::string max(255, 'a');
  EXPECT_TRUE(is_valid_topic(max, nullptr));
  EXPECT_EQ(topic_why(max + "a"), "longer than 255 bytes");
  EXPECT_EQ(topic_why(""), "must not be empty");
}

TEST(Topic, EmptySegments) {
  EXPECT_EQ(topic_why("."), "segment 1 is empty");
  EXPECT_EQ(topic_why(".order"), "segment 1 is empty");
  EXPECT_EQ(topic_why("order."), "segment 2 is empty");
  EXPECT_EQ(topic_why("order..created"), "segment 2 is empty");
  EXPECT_EQ(topic_why("a.b.c..d"), "segment 4 is empty");
}

TEST(Topic, BadCharacters) {
  EXPECT_EQ(topic_why("order!"), "character '!' is not allowed");
  EXPECT_EQ(topic_why("order.cre/ated"), "character '/' is not allowed");
  EXPECT_EQ(topic_why("order created"), "a space is not allowed");
  EXPECT_EQ(topic_why("order\ncreated"), "byte 0x0A is not allowed");
  EXPECT_EQ(topic_why("caf\xc3\xa9"), "byte 0xC3 is not allowed");
  EXPECT_EQ(topic_why("order.*"), "character '*' is not allowed");
  EXPECT_EQ(topic_why("#"), "character '#' is not allowed");
  EXPECT_EQ(topic_why(std::string_view("a\0b", 3)), "byte 0x00 is not allowed");
}

TEST(Topic, NullWhyIsAllowed) {
  EXPECT_FALSE(is_valid_topic("a..b", nullptr));
  EXPECT_FALSE(is_valid_pattern("a*", nullptr));
}

TEST(Pattern, ValidPatterns) {
  for (const char* p : {"order", "order.*", "order.#", "#", "*", "#.created", "*.*", "a.#.b", "#.#", "*.created.#"}) {
    std::string why;
    EXPECT_TRUE(is_valid_pattern(p, &why)) << p << ": " << why;
  }
}

TEST(Pattern, WildcardsMustBeWholeSegments) {
  EXPECT_EQ(pattern_why("order*"), "wildcard '*' must be a whole segment (segment 1)");
  EXPECT_EQ(pattern_why("order.cr*"), "wildcard '*' must be a whole segment (segment 2)");
  EXPECT_EQ(pattern_why("a.##"), "wildcard '#' must be a whole segment (segment 2)");
  EXPECT_EQ(pattern_why("**"), "wildcard '*' must be a whole segment (segment 1)");
}

TEST(Pattern, SameRulesAsTopicOtherwise) {
  EXPECT_EQ(pattern_why(""), "must not be empty");
  EXPECT_EQ(pattern_why("order..*"), "segment 2 is empty");
  EXPECT_EQ(pattern_why("#."), "segment 2 is empty");
  EXPECT_EQ(pattern_why("order.?"), "character '?' is not allowed");
  EXPECT_EQ(pattern_why(std::string(256, '*')), "longer than 255 bytes");
}

struct MatchCase {
  const char* pattern;
  const char* topic;
  bool matches;
};

TEST(TopicMatches, Table) {
  const MatchCase cases[] = {
      {"order.created", "order.created", true},
      {"order.created", "order.created.v2", false},
      {"order.created", "order", false},
      {"order.created", "Order.created", false},  // case-sensitive
      {"order.*", "order.created", true},
      {"order.*", "order", false},
      {"order.*", "order.created.v2", false},
      {"order.#", "order", true},
      {"order.#", "order.created", true},
      {"order.#", "order.created.v2", true},
      {"order.#", "orders.created", false},
      {"order.#", "order_x", false},
      {"#", "a", true},
      {"#", "a.b.c", true},
      {"#.created", "created", true},
      {"#.created", "a.b.created", true},
      {"#.created", "a.created.b", false},
      {"*", "a", true},
      {"*", "a.b", false},
      {"*.*", "a.b", true},
      {"*.*", "a", false},
      {"*.created", "order.created", true},
      {"*.created", "created", false},
      {"a.#.b", "a.b", true},
      {"a.#.b", "a.x.y.b", true},
      {"a.#.b", "a.x.y.c", false},
      {"#.#", "a", true},
      {"a.*.#", "a", false},
      {"a.*.#", "a.b", true},
      {"a.*.#", "a.b.c.d", true},
      {"#.b.#", "a.b.c", true},
      {"#.b.#", "b", true},
      {"#.b.#", "a.c", false},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(topic_matches(c.pattern, c.topic), c.matches) << "pattern " << c.pattern << " topic " << c.topic;
  }
}

TEST(TopicMatches, ManyHashesStayFast) {
  // Exponential backtracking would not finish; the DP is quadratic.
  std::string pattern;
  for (int i = 0; i < 60; ++i) pattern += "#.";
  pattern += "z";
  std::string topic;
  for (int i = 0; i < 120; ++i) topic += "a.";
  topic += "y";
  EXPECT_FALSE(topic_matches(pattern, topic));
  EXPECT_TRUE(topic_matches(pattern, topic.substr(0, topic.size() - 1) + "z"));
}

TEST(PatternSpecificity, Values) {
  EXPECT_EQ(pattern_specificity("order.created"), 0);
  EXPECT_EQ(pattern_specificity("order.*"), 2);
  EXPECT_EQ(pattern_specificity("*.*"), 3);
  EXPECT_EQ(pattern_specificity("order.#"), 101);
  EXPECT_EQ(pattern_specificity("#"), 101);
  EXPECT_EQ(pattern_specificity("*.#"), 102);
  EXPECT_EQ(pattern_specificity("#.b.#"), 201);
}

TEST(PatternSpecificity, OrdersExactThenStarsThenHashes) {
  EXPECT_LT(pattern_specificity("order.created"), pattern_specificity("order.*"));
  EXPECT_LT(pattern_specificity("order.*"), pattern_specificity("*.*"));
  // Any number of '*' is more specific than one '#'.
  EXPECT_LT(pattern_specificity("*.*.*.*.*.*.*.*.*.*"), pattern_specificity("order.#"));
}

}  // namespace
}  // namespace relaybus::core
