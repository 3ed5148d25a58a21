// A raw TCP connection to 127.0.0.1:port, for tests that play a peer or a
// stranger by hand: the descriptor, or -1 (errno says why).
#ifndef HALKA_TESTS_TESTING_LOOPBACK_H_
#define HALKA_TESTS_TESTING_LOOPBACK_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>

namespace halka::testing {

inline int DialLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace halka::testing

#endif  // HALKA_TESTS_TESTING_LOOPBACK_H_
