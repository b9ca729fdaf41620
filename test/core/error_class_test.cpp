#include "core/error_class.hpp"

#include <gtest/gtest.h>

namespace relaybus::core {
namespace {

ErrorCause of(const char* sqlstate, const char* message = "") { return classify_error(sqlstate, message); }

TEST(ErrorClass, DataErrorsAreTheDeliverys) {
  EXPECT_EQ(of("22023", "payload string too long"), ErrorCause::Delivery);  // NOTIFY payload
  EXPECT_EQ(of("22P02"), ErrorCause::Delivery);                             // invalid text representation
  EXPECT_EQ(of("22008"), ErrorCause::Delivery);                             // datetime overflow
  EXPECT_EQ(of("23505"), ErrorCause::Delivery);
  EXPECT_EQ(of("23502"), ErrorCause::Delivery);
  EXPECT_EQ(of("21000"), ErrorCause::Delivery);
  EXPECT_EQ(of("54000", "total size of jsonb object elements exceeds the maximum of 268435455 bytes"),
            ErrorCause::Delivery);
  EXPECT_EQ(of("54001", "stack depth limit exceeded"), ErrorCause::Delivery);  // a deeply nested payload
}

TEST(ErrorClass, AFullNotifyQueueIsTheEnvironmentsThoughItShares54000) {
  EXPECT_EQ(of("54000", "too many notifications in the NOTIFY queue"), ErrorCause::Environment);
  EXPECT_EQ(of("54000", "TOO MANY notifications in the NOTIFY queue"), ErrorCause::Delivery);
}

TEST(ErrorClass, EnvironmentalErrorsAreNobodysDelivery) {
  for (const char* s : {"40001",  // serialization failure
                        "40P01",  // deadlock
                        "55P03",  // lock_timeout, and a dispatcher that lost its lanes
                        "55006",  // object in use
                        "57014",  // statement_timeout, cancel
                        "57P01",  // admin shutdown
                        "25006",  // read-only transaction (default_transaction_read_only, recovery)
                        "25P03",  // idle_in_transaction_session_timeout
                        "53100",  // disk full
                        "53200",  // out of memory
                        "53300",  // too many connections
                        "08006",  // connection failure
                        "58030",  // I/O error
                        "42501",  // insufficient privilege
                        "42P01",  // undefined table (the extension dropped under the worker)
                        "3F000",  // invalid schema name
                        "3D000", "72000", "F0000"})
    EXPECT_EQ(of(s), ErrorCause::Environment) << s;
}

TEST(ErrorClass, EverythingElseIsUnknown) {
  for (const char* s : {"XX000", "XX001", "P0001", "0A000", "2F000", "38000", "HV000", "01000", "00000"})
    EXPECT_EQ(of(s), ErrorCause::Unknown) << s;
}

TEST(ErrorClass, MalformedSqlstatesAreUnknown) {
  for (const char* s : {"", "4", "4000", "400011", "40 01", "4000a",
                        "22\x01"
                        "23"})
    EXPECT_EQ(of(s), ErrorCause::Unknown) << s;
}

TEST(ErrorClass, Names) {
  EXPECT_STREQ(error_cause_name(ErrorCause::Delivery), "delivery");
  EXPECT_STREQ(error_cause_name(ErrorCause::Environment), "environment");
  EXPECT_STREQ(error_cause_name(ErrorCause::Unknown), "unknown");
}

}  // namespace
}  // namespace relaybus::core
