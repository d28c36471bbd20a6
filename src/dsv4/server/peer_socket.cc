#include "dsv4/server/peer_socket.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>
#include <memory>

namespace dsv4::server {
namespace {

// "addr", port of a socket address, spelled the way httplib spells Request::remote_addr.
bool numeric_address(const sockaddr_storage& a, socklen_t len, std::string& host, int& port) {
  char h[NI_MAXHOST], s[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, h, sizeof h, s, sizeof s,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  host = h;
  port = std::atoi(s);
  return true;
}

}  // namespace

std::optional<PeerSocket> PeerSocket::find(const std::string& local_addr, int local_port, const std::string& remote_addr,
                                           int remote_port) {
  std::unique_ptr<DIR, int (*)(DIR*)> dir(opendir("/proc/self/fd"), closedir);
  if (!dir) return std::nullopt;
  while (const dirent* e = readdir(dir.get())) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd < 0) continue;
    struct stat st;
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage peer{}, self{};
    socklen_t peer_len = sizeof peer, self_len = sizeof self;
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) continue;
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&self), &self_len) != 0) continue;
    std::string peer_host, self_host;
    int peer_port = -1, self_port = -1;
    if (!numeric_address(peer, peer_len, peer_host, peer_port) || !numeric_address(self, self_len, self_host, self_port))
      continue;
    if (peer_host == remote_addr && peer_port == remote_port && self_port == local_port &&
        (local_addr.empty() || self_host == local_addr))
      return PeerSocket(static_cast<int>(fd));
  }
  return std::nullopt;
}

bool PeerSocket::peer_closed() const {
  pollfd p{fd_, POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace dsv4::server
