// Lines of a stream with a bound on each line's length, so that one huge line (a 300 MB JSON
// object in a --batch file) costs a counter instead of its size in memory.
#pragma once

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

namespace dsv4 {

class BoundedLineReader {
 public:
  BoundedLineReader(std::istream& in, size_t max_bytes);

  struct Line {
    std::string text;       // without its '\n'; empty when too_long
    bool too_long = false;  // longer than max_bytes: skipped, not stored
    uint64_t bytes = 0;     // the line's length, '\n' not counted
  };
  // The next line ('\n'-terminated; a last line without one counts too). false at the end of
  // the stream or on a read error (then failed() says so).
  bool next(Line& line);
  bool failed() const { return in_.bad(); }

 private:
  bool fill();

  std::istream& in_;
  size_t max_bytes_;
  std::vector<char> buffer_;
  size_t pos_ = 0;
  size_t end_ = 0;
};

}  // namespace dsv4
