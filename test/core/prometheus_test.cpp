#include "core/prometheus.hpp"

#include <gtest/gtest.h>

#include <algorithm>

using relaybus::core::prometheus_label;

TEST(PrometheusLabel, EscapesWhatTheFormatRequires) {
  EXPECT_EQ(prometheus_label("orders.http"), "orders.http");
  EXPECT_EQ(prometheus_label("a\"b"), "a\\\"b");
  EXPECT_EQ(prometheus_label("a\\b"), "a\\\\b");
  EXPECT_EQ(prometheus_label("a\nb"), "a\\nb");
  EXPECT_EQ(prometheus_label(""), "");
  EXPECT_EQ(prometheus_label("\xc3\xa9t\xc3\xa9"), "\xc3\xa9t\xc3\xa9");  // UTF-8 as it is
}

using relaybus::core::append_prometheus_histogram;
using relaybus::core::append_prometheus_histogram_head;
using relaybus::core::LatencyHistogram;

TEST(LatencyHistogram, BucketsAreCumulativeAndCountEverything) {
  LatencyHistogram h;
  h.observe(0.0005);  // <= 1 ms
  h.observe(0.003);   // <= 5 ms
  h.observe(0.25);    // on a bound: counted in it
  h.observe(1000);    // above every bound: +Inf only
  EXPECT_EQ(h.count, 4u);
  EXPECT_DOUBLE_EQ(h.sum_s, 1000.2535);
  EXPECT_EQ(h.buckets[0], 1u);   // 0.001
  EXPECT_EQ(h.buckets[1], 1u);   // 0.0025
  EXPECT_EQ(h.buckets[2], 2u);   // 0.005
  EXPECT_EQ(h.buckets[6], 2u);   // 0.1
  EXPECT_EQ(h.buckets[7], 3u);   // 0.25
  EXPECT_EQ(h.buckets[15], 3u);  // 300
  for (size_t i = 1; i < h.buckets.size(); i++) EXPECT_LE(h.buckets[i - 1], h.buckets[i]);
}

TEST(LatencyHistogram, QuantilesInterpolateInsideTheirBucket) {
  LatencyHistogram h;
  EXPECT_EQ(h.quantile_ms(0.5), -1) << "no observations";
  for (int i = 0; i < 100; i++) h.observe(0.004);  // the (0.0025, 0.005] bucket
  EXPECT_DOUBLE_EQ(h.quantile_ms(0.5), 3.75);
  EXPECT_DOUBLE_EQ(h.quantile_ms(1), 5);
  h.observe(20);  // (10, 30]
  EXPECT_NEAR(h.quantile_ms(0.99), 2.5 + 2.5 * 99.99 / 100, 1e-9) << "99.99 of 101 lie in the 100 at 4 ms";
  EXPECT_DOUBLE_EQ(h.quantile_ms(1), 30000);
  h.observe(1000);  // beyond the last bound
  EXPECT_DOUBLE_EQ(h.quantile_ms(1), 300000);
}

TEST(LatencyHistogram, RendersOneSeriesInTheTextFormat) {
  LatencyHistogram h;
  h.observe(0.002);
  h.observe(7);
  std::string out;
  append_prometheus_histogram_head(&out, "x_seconds", "From publish to completion.");
  append_prometheus_histogram(&out, "x_seconds", "handler", "a\"b", h);
  EXPECT_EQ(out.rfind("# HELP x_seconds From publish to completion.\n# TYPE x_seconds histogram\n", 0), 0u);
  EXPECT_NE(out.find("x_seconds_bucket{handler=\"a\\\"b\",le=\"0.001\"} 0\n"), std::string::npos);
  EXPECT_NE(out.find("x_seconds_bucket{handler=\"a\\\"b\",le=\"0.0025\"} 1\n"), std::string::npos);
  EXPECT_NE(out.find("x_seconds_bucket{handler=\"a\\\"b\",le=\"5\"} 1\n"), std::string::npos);
  EXPECT_NE(out.find("x_seconds_bucket{handler=\"a\\\"b\",le=\"10\"} 2\n"), std::string::npos);
  EXPECT_NE(out.find("x_seconds_bucket{handler=\"a\\\"b\",le=\"300\"} 2\n"), std::string::npos);
  EXPECT_NE(out.find("x_seconds_bucket{handler=\"a\\\"b\",le=\"300\"} 2\n"
                     "x_seconds_bucket{handler=\"a\\\"b\",le=\"+Inf\"} 2\n"
                     "x_seconds_sum{handler=\"a\\\"b\"} 7.002000\n"
                     "x_seconds_count{handler=\"a\\\"b\"} 2\n"),
            std::string::npos);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 2 + 17 + 2);
}
