// congestion_preload.so: every TCP socket the process opens takes the TCP
// congestion control named by HALKA_BENCH_CONGESTION (setsockopt
// TCP_CONGESTION right after socket()), so that a peer that has no such
// setting of its own (Open MPI's TCP transport, Gloo's TCP device) can be
// measured under the same congestion control as halka's wire links
// (bench/compare/compare.sh --tcp-congestion). Unset or empty: nothing is
// changed. A name the kernel refuses leaves the socket as it was and is
// said once on standard error. Benchmarks only.
//
//   cc -shared -fPIC -O2 -o congestion_preload.so congestion_preload.c -ldl
//   HALKA_BENCH_CONGESTION=cubic LD_PRELOAD=./congestion_preload.so prog
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

static int (*real_socket)(int, int, int);

// Resolved once, before the program's threads start.
__attribute__((constructor)) static void resolve(void) {
  real_socket = (int (*)(int, int, int))dlsym(RTLD_NEXT, "socket");
}

int socket(int domain, int type, int protocol) {
  static _Atomic int said;
  if (real_socket == NULL) {
    errno = ENOSYS;
    return -1;
  }
  const int fd = real_socket(domain, type, protocol);
  const char* name = getenv("HALKA_BENCH_CONGESTION");
  const int stream = (type & 0xf) == SOCK_STREAM;
  if (fd >= 0 && name != NULL && name[0] != '\0' && stream &&
      (domain == AF_INET || domain == AF_INET6) &&
      (protocol == 0 || protocol == IPPROTO_TCP)) {
    const int saved = errno;
    if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, strlen(name)) != 0 &&
        !said++) {
      // compare.sh looks for these words in each side's log.
      fprintf(stderr, "congestion_preload: the kernel refused %s: %s\n", name,
              strerror(errno));
    }
    errno = saved;
  }
  return fd;
}
