// Connection hang-up detection by descriptor lookup and poll(POLLRDHUP) (see connection_probe.h).
#include "server/connection_probe.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace ds::server {
namespace {

bool same_endpoint(const sockaddr_storage& ss, const std::string& addr, int port) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    if (ntohs(in->sin_port) != port) return false;
    inet_ntop(AF_INET, &in->sin_addr, buf, sizeof buf);
  } else if (ss.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
    if (ntohs(in6->sin6_port) != port) return false;
    inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof buf);
  } else {
    return false;
  }
  return addr == buf;
}

}  // namespace

ConnectionProbe::ConnectionProbe(const std::string& remote_addr, int remote_port,
                                 const std::string& local_addr, int local_port) {
  if (remote_port <= 0) return;
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const int fd = std::atoi(e->d_name);
    if (fd <= 2 || fd == dirfd(dir)) continue;
    sockaddr_storage peer{};
    socklen_t len = sizeof peer;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0) continue;
    if (!same_endpoint(peer, remote_addr, remote_port)) continue;
    if (local_port > 0) {
      sockaddr_storage local{};
      len = sizeof local;
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) continue;
      if (!same_endpoint(local, local_addr, local_port)) continue;
    }
    fd_ = fd;
    break;
  }
  closedir(dir);
}

bool ConnectionProbe::closed() const {
  if (fd_ < 0) return false;
  pollfd p{};
  p.fd = fd_;
  p.events = POLLIN | POLLRDHUP;
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
  if (p.revents & POLLIN) {
    // Readable: either pipelined bytes (alive) or an orderly close (recv returns 0).
    char c;
    const ssize_t n = recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0;
  }
  return false;
}

}  // namespace ds::server
