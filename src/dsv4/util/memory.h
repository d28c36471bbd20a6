// Process memory facts: peak and current resident set, and what the machine can give.
#pragma once

#include <cstdint>
#include <string>

namespace dsv4 {

// VmHWM / VmRSS of this process from /proc/self/status (bytes; 0 if unavailable).
uint64_t peak_rss_bytes();
uint64_t current_rss_bytes();

// MemAvailable from /proc/meminfo, capped by the cgroup v2 memory.max if one is set
// (bytes; 0 if unavailable).
uint64_t available_memory_bytes();

// "1.50 GiB", "12.8 MiB", "512 B".
std::string format_bytes(uint64_t bytes);

}  // namespace dsv4
