// Internal to halka (outside client/include/, not part of the SDK): the
// SDK's calls that answer with the wire's messages, and the conversions
// from those messages to the SDK's plain structs (halka/ring.h). For
// halka's own tools that print or forward the whole reply: halkactl's
// `health --json` and `trace`, the Python module's info/health JSON. A
// trainer uses Client::Info and Client::RingHealth.
#ifndef HALKA_CLIENT_CLIENT_PROTO_H_
#define HALKA_CLIENT_CLIENT_PROTO_H_

#include "absl/status/statusor.h"
#include "client/op_spec.h"
#include "halka/client.h"
#include "halka/ring.h"
#include "halka/v1/rendezvous.pb.h"
#include "halka/v1/worker.pb.h"

namespace halka {

struct ClientProto {
  // Worker.GetInfo and Worker.GetRingHealth through `client`'s channel.
  static absl::StatusOr<v1::InfoReply> Info(Client& client);
  static absl::StatusOr<v1::RingHealth> RingHealth(Client& client);
  // One operation through `client`'s transfer (client.cc): the host
  // collectives of client/collectives.cc run through it.
  static absl::StatusOr<OpInfo> Run(Client& client, const v1::OpSpec& spec,
                                    const OpIo& io);
};

// Field for field (client_proto.cc).
OpInfo ToOpInfo(const v1::OpStats& stats);  // transfer, session: unset
Member ToMember(const v1::Member& m);
WorkerInfo ToWorkerInfo(const v1::InfoReply& reply);
RingHealth ToRingHealth(const v1::RingHealth& reply);

}  // namespace halka

#endif  // HALKA_CLIENT_CLIENT_PROTO_H_
