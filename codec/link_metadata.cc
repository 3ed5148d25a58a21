#include "codec/link_metadata.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace halka {
namespace {

using Metadata = std::multimap<grpc::string_ref, grpc::string_ref>;

absl::string_view Get(const Metadata& md, const char* key) {
  auto it = md.find(key);
  return it == md.end() ? absl::string_view()
                        : absl::string_view(it->second.data(),
                                            it->second.size());
}

template <typename T>
std::optional<T> GetNumber(const Metadata& md, const char* key) {
  T value;
  if (!absl::SimpleAtoi(Get(md, key), &value)) return std::nullopt;
  return value;
}

}  // namespace

void AddLinkMetadata(const LinkMetadata& metadata, grpc::ClientContext* ctx) {
  ctx->AddMetadata(kLinkJobKey, metadata.job_id);
  ctx->AddMetadata(kLinkGenerationKey, absl::StrCat(metadata.generation));
  ctx->AddMetadata(kLinkRankKey, absl::StrCat(metadata.rank));
  ctx->AddMetadata(kLinkWorldSizeKey, absl::StrCat(metadata.world_size));
}

ReceivedLinkMetadata ParseLinkMetadata(const Metadata& client_metadata) {
  ReceivedLinkMetadata out;
  out.job_id = std::string(Get(client_metadata, kLinkJobKey));
  out.generation = GetNumber<uint64_t>(client_metadata, kLinkGenerationKey);
  out.rank = GetNumber<int>(client_metadata, kLinkRankKey);
  out.world_size = GetNumber<int>(client_metadata, kLinkWorldSizeKey);
  return out;
}

}  // namespace halka
