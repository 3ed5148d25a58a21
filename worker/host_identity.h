// Which host a worker says it runs on when it joins (JoinRequest.host).
// The rendezvous keeps the ranks of one host adjacent in the ring
// (Membership.ring_order), so that the ring crosses between hosts once each
// way: two workers are on one host exactly when they name the same one.
//
// In order: --host_id (env HALKA_HOST_ID) when set; else the Kubernetes
// node name in $NODE_NAME (the downward API's spec.nodeName, as
// deploy/k8s/base/workers.yaml sets it: pods on one node have different
// hostnames and network namespaces); else "<hostname>/<network namespace>"
// (NetworkNamespaceId, core/shm_ring.h), so that hosts emulated by
// network namespaces on one machine count as different hosts, as they do
// for same-host links.
//
// Thread-safety: free functions; ResolveHostId reads the environment.
#ifndef HALKA_WORKER_HOST_IDENTITY_H_
#define HALKA_WORKER_HOST_IDENTITY_H_

#include <string>

namespace halka {

// The rule above over its inputs (node_name "": unset).
std::string HostIdFrom(const std::string& flag, const std::string& node_name,
                       const std::string& hostname, const std::string& netns);

// The rule above for this process: `flag` is WorkerOptions::host_id.
std::string ResolveHostId(const std::string& flag);

}  // namespace halka

#endif  // HALKA_WORKER_HOST_IDENTITY_H_
