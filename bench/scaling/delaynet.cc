// halka-delaynet: a network with latency between network namespaces, for
// a kernel without netem (or fq, for an EDT delay). Each namespace named
// on the command line gets a point-to-point TUN device (tun0) that this
// process holds; every IPv4 packet a namespace sends into its tun0 is
// delivered into the tun0 of the namespace that owns its destination
// address, after:
//   - its sending host's uplink has serialised it (--rate_mbit; 0: no cap),
//   - a one-way propagation delay (--delay_us),
//   - its receiving host's downlink has serialised it (the same rate),
// so that each host has one NIC of that rate each way, and a packet's
// one-way latency is at least the delay (the round trip twice it). The
// downlink takes packets in the order they reach it (the switch's egress
// port), whichever host sent them. Packets for an address nobody owns, and
// non-IPv4 packets, are dropped; so is a packet that finds more than
// --queue_kib waiting for a host's uplink or downlink (a tail drop, as a
// NIC's or a switch port's: TCP backs off).
//
// Usage (as root):
//   halka-delaynet --delay_us=2000 [--rate_mbit=1000] [--queue_kib=4096]
//                  NAMESPACE=ADDRESS ...
// It creates tun0 in each namespace (/var/run/netns/NAMESPACE, as `ip
// netns add` makes them), prints "halka-delaynet ready" and waits; the
// caller gives each tun0 its address (ip -n NS addr add ADDRESS/24 dev
// tun0; ip -n NS link set tun0 up). The devices go with the process: on
// SIGTERM or SIGINT it prints what it forwarded and exits.
//
// One thread, ppoll with a nanosecond timeout: each packet leaves within
// a few tens of microseconds of its due time on an idle machine (more
// under load: the figures that use it say so).
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <queue>
#include <string>
#include <vector>

namespace {

volatile sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "halka-delaynet: %s\n", what.c_str());
  std::exit(2);
}

bool ParseInt(const char* s, int64_t lo, int64_t hi, int64_t* out) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

// A TUN device named tun0, made inside network namespace `ns`; this
// thread returns to its own namespace after.
int MakeTun(const std::string& ns) {
  const int self = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  if (self < 0) Die("cannot open /proc/self/ns/net: " + std::string(strerror(errno)));
  const std::string path = "/var/run/netns/" + ns;
  const int target = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (target < 0) Die("no network namespace " + ns + " (" + path + "): " + strerror(errno));
  if (setns(target, CLONE_NEWNET) != 0) Die("setns into " + ns + ": " + strerror(errno));
  const int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) Die("open /dev/net/tun: " + std::string(strerror(errno)));
  ifreq req;
  std::memset(&req, 0, sizeof(req));
  req.ifr_flags = IFF_TUN | IFF_NO_PI;
  std::strncpy(req.ifr_name, "tun0", IFNAMSIZ - 1);
  if (ioctl(fd, TUNSETIFF, &req) != 0) Die("TUNSETIFF tun0 in " + ns + ": " + strerror(errno));
  if (setns(self, CLONE_NEWNET) != 0) Die("setns back: " + std::string(strerror(errno)));
  close(target);
  close(self);
  return fd;
}

struct Host {
  std::string ns;
  uint32_t addr = 0;  // network order
  int fd = -1;
  int64_t up_free_ns = 0;    // its uplink is busy until then
  int64_t down_free_ns = 0;  // its downlink
  uint64_t sent_packets = 0, sent_bytes = 0;
  uint64_t dropped_up = 0;    // its uplink's queue was full
  uint64_t dropped_down = 0;  // its downlink's queue was full
  uint64_t write_failed = 0;  // its tun0 refused a packet (its queue full)
};

// A packet between hosts: first due at the switch (sent, and the delay
// past), then due at its receiver once the downlink has serialised it.
struct Packet {
  int64_t due_ns;
  uint64_t seq;  // FIFO among packets due at the same time
  int from, to;
  bool at_switch;
  std::vector<uint8_t> bytes;
};
struct Later {
  bool operator()(const Packet* a, const Packet* b) const {
    return a->due_ns != b->due_ns ? a->due_ns > b->due_ns : a->seq > b->seq;
  }
};

}  // namespace

int main(int argc, char** argv) {
  int64_t delay_us = -1, rate_mbit = 0, queue_kib = 4096;
  std::vector<Host> hosts;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      const std::string prefix = std::string(name) + "=";
      return a.rfind(prefix, 0) == 0 ? argv[i] + prefix.size() : nullptr;
    };
    if (const char* v = value("--delay_us")) {
      if (!ParseInt(v, 0, 10000000, &delay_us)) Die("--delay_us takes 0..10000000");
    } else if (const char* v = value("--rate_mbit")) {
      if (!ParseInt(v, 0, 1000000, &rate_mbit)) Die("--rate_mbit takes 0..1000000 (0: no cap)");
    } else if (const char* v = value("--queue_kib")) {
      if (!ParseInt(v, 64, 1 << 22, &queue_kib)) Die("--queue_kib takes 64..4194304");
    } else if (a.rfind("--", 0) == 0) {
      Die("unknown option " + a);
    } else {
      const size_t eq = a.find('=');
      Host h;
      if (eq == std::string::npos || eq == 0) Die("want NAMESPACE=ADDRESS, got " + a);
      h.ns = a.substr(0, eq);
      in_addr ia;
      if (inet_pton(AF_INET, a.substr(eq + 1).c_str(), &ia) != 1) Die("not an IPv4 address: " + a);
      h.addr = ia.s_addr;
      for (const Host& o : hosts) {
        if (o.addr == h.addr || o.ns == h.ns) Die("named twice: " + a);
      }
      hosts.push_back(h);
    }
  }
  if (delay_us < 0 || hosts.size() < 2) {
    Die("usage: halka-delaynet --delay_us=N [--rate_mbit=M] [--queue_kib=K] NS=ADDR NS=ADDR ...");
  }
  // The stop signals are taken only inside ppoll (its mask), so one that
  // comes between the loop's look at g_stop and the sleep is not lost.
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = OnSignal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  sigset_t stops, sleep_mask;
  sigemptyset(&stops);
  sigaddset(&stops, SIGTERM);
  sigaddset(&stops, SIGINT);
  sigprocmask(SIG_BLOCK, &stops, &sleep_mask);
  sigdelset(&sleep_mask, SIGTERM);
  sigdelset(&sleep_mask, SIGINT);
  std::map<uint32_t, int> owner;
  for (size_t i = 0; i < hosts.size(); ++i) {
    hosts[i].fd = MakeTun(hosts[i].ns);
    owner[hosts[i].addr] = static_cast<int>(i);
  }
  std::printf("halka-delaynet ready: %zu namespaces, %lld us one way, %s\n",
              hosts.size(), static_cast<long long>(delay_us),
              rate_mbit > 0 ? (std::to_string(rate_mbit) + " Mbit/s per host each way").c_str()
                            : "no rate cap");
  std::fflush(stdout);

  // Nanoseconds a packet of n bytes takes through one NIC.
  auto serialise = [&](size_t n) -> int64_t {
    return rate_mbit > 0 ? static_cast<int64_t>(n) * 8000 / rate_mbit : 0;
  };
  // Bytes waiting for a NIC that is busy `backlog_ns` more.
  auto waiting = [&](int64_t backlog_ns) -> int64_t {
    return std::max<int64_t>(0, backlog_ns) * rate_mbit / 8000;
  };
  const int64_t delay_ns = delay_us * 1000;
  const int64_t queue_bytes = queue_kib * 1024;
  std::priority_queue<Packet*, std::vector<Packet*>, Later> due;
  uint64_t seq = 0, unroutable = 0;
  std::vector<pollfd> fds(hosts.size());
  std::vector<uint8_t> buf(65536 + 4);
  while (!g_stop) {
    // Deliver what is due.
    int64_t now = NowNs();
    while (!due.empty() && due.top()->due_ns <= now) {
      Packet* p = due.top();
      due.pop();
      Host& to = hosts[p->to];
      const int64_t size = static_cast<int64_t>(p->bytes.size());
      if (p->at_switch) {
        // At the receiver's port, in arrival order: its downlink next.
        const int64_t arrived = p->due_ns;
        if (rate_mbit > 0 &&
            waiting(to.down_free_ns - arrived) + size > queue_bytes) {
          ++to.dropped_down;
          delete p;
          continue;
        }
        to.down_free_ns = std::max(to.down_free_ns, arrived) + serialise(size);
        p->due_ns = to.down_free_ns;
        p->seq = seq++;
        p->at_switch = false;
        due.push(p);
        continue;
      }
      // A full device queue drops it, as a NIC's ring would.
      if (write(to.fd, p->bytes.data(), p->bytes.size()) != size) {
        ++to.write_failed;
      }
      delete p;
    }
    for (size_t i = 0; i < hosts.size(); ++i) fds[i] = {hosts[i].fd, POLLIN, 0};
    timespec wait;
    timespec* waitp = nullptr;
    if (!due.empty()) {
      const int64_t left = std::max<int64_t>(0, due.top()->due_ns - NowNs());
      wait.tv_sec = left / 1000000000;
      wait.tv_nsec = left % 1000000000;
      waitp = &wait;
    }
    const int n = ppoll(fds.data(), fds.size(), waitp, &sleep_mask);
    if (n < 0) {
      if (errno == EINTR) continue;
      Die("ppoll: " + std::string(strerror(errno)));
    }
    if (n == 0) continue;
    now = NowNs();
    for (size_t i = 0; i < hosts.size(); ++i) {
      if ((fds[i].revents & (POLLERR | POLLHUP | POLLNVAL)) != 0) {
        Die("tun0 of " + hosts[i].ns + " failed (removed?)");
      }
      if ((fds[i].revents & POLLIN) == 0) continue;
      for (int burst = 0; burst < 64; ++burst) {  // then look at the others
        const ssize_t got = read(hosts[i].fd, buf.data(), buf.size());
        if (got <= 0) break;
        if (got < 20 || (buf[0] >> 4) != 4) {
          ++unroutable;
          continue;
        }
        uint32_t dst;
        std::memcpy(&dst, buf.data() + 16, 4);
        auto it = owner.find(dst);
        Host& from = hosts[i];
        if (it == owner.end() || it->second == static_cast<int>(i)) {
          ++unroutable;
          continue;
        }
        if (rate_mbit > 0 &&
            waiting(from.up_free_ns - now) + got > queue_bytes) {
          ++from.dropped_up;
          continue;
        }
        from.up_free_ns = std::max(from.up_free_ns, now) + serialise(got);
        auto* p = new Packet{from.up_free_ns + delay_ns, seq++,
                             static_cast<int>(i), it->second, true,
                             std::vector<uint8_t>(buf.data(), buf.data() + got)};
        ++from.sent_packets;
        from.sent_bytes += static_cast<uint64_t>(got);
        due.push(p);
      }
    }
  }
  for (const Host& h : hosts) {
    std::printf("halka-delaynet: %s sent %llu packets, %llu B; dropped %llu "
                "at its uplink, %llu at its downlink; its tun0 refused %llu\n",
                h.ns.c_str(), static_cast<unsigned long long>(h.sent_packets),
                static_cast<unsigned long long>(h.sent_bytes),
                static_cast<unsigned long long>(h.dropped_up),
                static_cast<unsigned long long>(h.dropped_down),
                static_cast<unsigned long long>(h.write_failed));
  }
  std::printf("halka-delaynet: %llu packets with no owner dropped\n",
              static_cast<unsigned long long>(unroutable));
  while (!due.empty()) {
    delete due.top();
    due.pop();
  }
  return 0;
}
