#pragma once

#include <string>
#include <vector>

#include "model.hpp"

namespace bench {

// Runs in a forked child: connects, prepares, writes 'r' (or 'e'+message) to
// ready_fd, reads a Go from go_fd, works until Go::t1 (a listener: until SIGUSR1
// and quiet), writes its files and _exits. Never returns.
[[noreturn]] int child_main(const ChildSpec& spec, int ready_fd, int go_fd);

ChildOut read_child_out(const std::string& dir, const std::string& label);
std::vector<Receipt> read_receipts(const std::string& dir, const std::string& label);
std::vector<PubRec> read_pubs(const std::string& dir, const std::string& label);

}  // namespace bench
