// The web chat page (src/dsv4/server/web/), compiled into the binary by CMake
// (embed_web_assets.cmake generates the definition), so `dsv4 serve` needs no files at run time.
#pragma once

#include <span>
#include <string_view>

namespace dsv4::server {

struct WebAsset {
  std::string_view path;          // "/index.html", "/app.js", ...
  std::string_view content_type;  // with charset for text
  std::string_view body;
};

std::span<const WebAsset> web_assets();

}  // namespace dsv4::server
