#include "worker/host_identity.h"

#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "core/shm_ring.h"

namespace halka {

std::string HostIdFrom(const std::string& flag, const std::string& node_name,
                       const std::string& hostname, const std::string& netns) {
  if (!flag.empty()) return flag;
  if (!node_name.empty()) return node_name;
  const std::string host = hostname.empty() ? "localhost" : hostname;
  return netns.empty() ? host : absl::StrCat(host, "/", netns);
}

std::string ResolveHostId(const std::string& flag) {
  const char* node = std::getenv("NODE_NAME");
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) name[0] = '\0';
  return HostIdFrom(flag, node != nullptr ? node : "", name,
                    NetworkNamespaceId());
}

}  // namespace halka
