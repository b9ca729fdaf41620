#include "core/prometheus.hpp"

#include <gtest/gtest.h>

using relaybus::core::prometheus_label;

TEST(PrometheusLabel, EscapesWhatTheFormatRequires) {
  EXPECT_EQ(prometheus_label("orders.http"), "orders.http");
  EXPECT_EQ(prometheus_label("a\"b"), "a\\\"b");
  EXPECT_EQ(prometheus_label("a\\b"), "a\\\\b");
  EXPECT_EQ(prometheus_label("a\nb"), "a\\nb");
  EXPECT_EQ(prometheus_label(""), "");
  EXPECT_EQ(prometheus_label("\xc3\xa9t\xc3\xa9"), "\xc3\xa9t\xc3\xa9");  // UTF-8 as it is
}
