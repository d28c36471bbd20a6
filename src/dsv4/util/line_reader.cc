#include "dsv4/util/line_reader.h"

#include <cstring>

namespace dsv4 {

BoundedLineReader::BoundedLineReader(std::istream& in, size_t max_bytes)
    : in_(in), max_bytes_(max_bytes), buffer_(1 << 16) {}

bool BoundedLineReader::fill() {
  if (in_.bad() || in_.eof()) return false;
  in_.read(buffer_.data(), static_cast<std::streamsize>(buffer_.size()));
  pos_ = 0;
  end_ = static_cast<size_t>(in_.gcount());
  return end_ > 0;
}

bool BoundedLineReader::next(Line& line) {
  line = Line();
  bool any = false;  // a byte or a '\n' was seen: there is a line
  for (;;) {
    if (pos_ == end_ && !fill()) return any && !in_.bad();
    any = true;
    const char* start = buffer_.data() + pos_;
    const auto* newline = static_cast<const char*>(std::memchr(start, '\n', end_ - pos_));
    const size_t n = newline ? static_cast<size_t>(newline - start) : end_ - pos_;
    line.bytes += n;
    if (line.bytes > max_bytes_) {
      line.too_long = true;
      std::string().swap(line.text);
    } else {
      line.text.append(start, n);
    }
    pos_ += n;
    if (newline) {
      ++pos_;
      return true;
    }
  }
}

}  // namespace dsv4
