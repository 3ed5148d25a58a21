// The metadata that opens a peer link or a parameter-server stream.
#include "codec/link_metadata.h"

#include <map>
#include <string>

#include "gtest/gtest.h"

namespace halka {
namespace {

using Metadata = std::multimap<grpc::string_ref, grpc::string_ref>;

TEST(LinkMetadataTest, ParsesEveryField) {
  const Metadata md = {{kLinkJobKey, "job-a"},
                       {kLinkGenerationKey, "18446744073709551615"},
                       {kLinkRankKey, "3"},
                       {kLinkWorldSizeKey, "4"}};
  const ReceivedLinkMetadata got = ParseLinkMetadata(md);
  EXPECT_EQ(got.job_id, "job-a");
  EXPECT_EQ(got.generation, 18446744073709551615u);
  EXPECT_EQ(got.rank, 3);
  EXPECT_EQ(got.world_size, 4);
}

TEST(LinkMetadataTest, AbsentKeysAreEmpty) {
  const ReceivedLinkMetadata got = ParseLinkMetadata(Metadata());
  EXPECT_EQ(got.job_id, "");
  EXPECT_FALSE(got.generation.has_value());
  EXPECT_FALSE(got.rank.has_value());
  EXPECT_FALSE(got.world_size.has_value());
}

TEST(LinkMetadataTest, MalformedNumbersAreAbsent) {
  const Metadata md = {{kLinkGenerationKey, "-1"},
                       {kLinkRankKey, "two"},
                       {kLinkWorldSizeKey, "99999999999"}};
  const ReceivedLinkMetadata got = ParseLinkMetadata(md);
  EXPECT_FALSE(got.generation.has_value());
  EXPECT_FALSE(got.rank.has_value());
  EXPECT_FALSE(got.world_size.has_value());
}

TEST(LinkMetadataTest, NegativeRankParses) {
  // Range checks belong to the server, which knows its ring.
  const Metadata md = {{kLinkRankKey, "-2"}};
  EXPECT_EQ(ParseLinkMetadata(md).rank, -2);
}

TEST(LinkMetadataTest, KeysAreTheOnesTheProtosDocument) {
  EXPECT_STREQ(kLinkJobKey, "halka-job");
  EXPECT_STREQ(kLinkGenerationKey, "halka-generation");
  EXPECT_STREQ(kLinkRankKey, "halka-rank");
  EXPECT_STREQ(kLinkWorldSizeKey, "halka-world-size");
}

}  // namespace
}  // namespace halka
