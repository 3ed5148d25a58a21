// Which host a worker names when it joins (worker/host_identity.h).
#include "worker/host_identity.h"

#include <cstdlib>

#include "gtest/gtest.h"
#include "core/shm_ring.h"

namespace halka {
namespace {

TEST(HostIdentity, FlagThenNodeNameThenHostnameAndNetworkNamespace) {
  EXPECT_EQ(HostIdFrom("rack3-n7", "node-a", "pod-0", "net:[1]"), "rack3-n7");
  EXPECT_EQ(HostIdFrom("", "node-a", "pod-0", "net:[1]"), "node-a");
  EXPECT_EQ(HostIdFrom("", "", "box", "net:[4026531840]"),
            "box/net:[4026531840]");
  EXPECT_EQ(HostIdFrom("", "", "box", ""), "box");
  EXPECT_EQ(HostIdFrom("", "", "", ""), "localhost");
  // Two network namespaces on one machine are two hosts.
  EXPECT_NE(HostIdFrom("", "", "box", "net:[1]"),
            HostIdFrom("", "", "box", "net:[2]"));
}

TEST(HostIdentity, ThisProcess) {
  unsetenv("NODE_NAME");
  const std::string here = ResolveHostId("");
  EXPECT_FALSE(here.empty());
  const std::string netns = NetworkNamespaceId();
  if (!netns.empty()) {
    EXPECT_EQ(here.substr(here.size() - netns.size()), netns) << here;
  }
  setenv("NODE_NAME", "k8s-node-3", 1);
  EXPECT_EQ(ResolveHostId(""), "k8s-node-3");
  EXPECT_EQ(ResolveHostId("given"), "given");
  unsetenv("NODE_NAME");
}

}  // namespace
}  // namespace halka
