// The call metadata that opens every peer link (Peer.Link) and every
// parameter-server stream (ParameterServer.Reduce): who is calling, for
// which job and ring. One builder for the dialling side, one parser for the
// serving side; what counts as valid (and the error that says otherwise)
// stays with each server, because a peer checks the rank against its ring
// and a parameter server against the caller's world size.
//
// Thread-safety: free functions over values; safe from any thread.
#ifndef HALKA_CODEC_LINK_METADATA_H_
#define HALKA_CODEC_LINK_METADATA_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "grpcpp/client_context.h"
#include "grpcpp/support/string_ref.h"

namespace halka {

inline constexpr char kLinkJobKey[] = "halka-job";
inline constexpr char kLinkGenerationKey[] = "halka-generation";
inline constexpr char kLinkRankKey[] = "halka-rank";
inline constexpr char kLinkWorldSizeKey[] = "halka-world-size";
// Frame batches (codec/frame_codec.h, DecodeFrames): the dialling side
// offers them with this key (value kFrameBatchesVersion) in its call
// metadata; a serving side that reads them answers with the same key and
// value in its initial metadata. Only then may the dialling side put
// several frames in one message. A side that knows nothing of it neither
// answers nor sends batches.
inline constexpr char kFrameBatchesKey[] = "halka-frame-batches";
inline constexpr char kFrameBatchesVersion[] = "1";

// What the dialling worker says about itself.
struct LinkMetadata {
  std::string job_id;
  uint64_t generation = 0;
  int rank = -1;
  int world_size = 0;
};

// Adds all four keys to `ctx` (before the call starts).
void AddLinkMetadata(const LinkMetadata& metadata, grpc::ClientContext* ctx);

// What a serving side received, field by field, unvalidated: a key that is
// absent or not a decimal number of the field's type reads as nullopt (an
// absent job as ""). Never fails.
struct ReceivedLinkMetadata {
  std::string job_id;
  std::optional<uint64_t> generation;
  std::optional<int> rank;
  std::optional<int> world_size;
};

ReceivedLinkMetadata ParseLinkMetadata(
    const std::multimap<grpc::string_ref, grpc::string_ref>& client_metadata);

}  // namespace halka

#endif  // HALKA_CODEC_LINK_METADATA_H_
