// Subcommand entry points. main.cc parses flags (the only file that includes CLI11) and
// calls one of these; each returns the process exit code.
#pragma once

#include <string>

namespace dsv4::cli {

struct InspectOptions {
  std::string dir;
  bool json = false;
};
int inspect(const InspectOptions& o);

}  // namespace dsv4::cli
