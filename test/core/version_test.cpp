// The version the programs report (User-Agent, --version, the *_info metric)
// is the extension's: relaybus.control's default_version.

#include "core/version.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <string>

namespace relaybus::core {
namespace {

TEST(Version, IsTheExtensionsDefaultVersion) {
  const std::string here = __FILE__;
  const std::string control = here.substr(0, here.rfind("/test/core/")) + "/relaybus.control";
  std::ifstream in(control);
  ASSERT_TRUE(in) << control;
  std::string line, version;
  const std::regex re("^default_version = '([^']+)'");
  std::smatch m;
  while (std::getline(in, line))
    if (std::regex_search(line, m, re)) version = m[1];
  ASSERT_FALSE(version.empty()) << "no default_version in " << control;
  EXPECT_EQ(std::string(kVersion), version);
}

}  // namespace
}  // namespace relaybus::core
