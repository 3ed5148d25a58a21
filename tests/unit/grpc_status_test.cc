#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "gtest/gtest.h"

namespace halka {
namespace {

TEST(GrpcStatusTest, OkMapsToOk) {
  grpc::Status g = ToGrpcStatus(absl::OkStatus());
  EXPECT_TRUE(g.ok());
  EXPECT_EQ(g.error_code(), grpc::StatusCode::OK);
  EXPECT_EQ(g.error_message(), "");
  absl::Status a = FromGrpcStatus(grpc::Status::OK);
  EXPECT_TRUE(a.ok());
  EXPECT_EQ(a.code(), absl::StatusCode::kOk);
  EXPECT_TRUE(FromGrpcStatus(ToGrpcStatus(absl::OkStatus())).ok());
}

TEST(GrpcStatusTest, EveryCodeRoundTripsWithMessage) {
  for (int c = 1; c <= 16; ++c) {
    SCOPED_TRACE(c);
    const absl::StatusCode code = static_cast<absl::StatusCode>(c);
    const std::string msg = absl::StrCat("something went wrong #", c,
                                         " with \"quotes\" and\nnewline");
    const absl::Status original(code, msg);
    const grpc::Status g = ToGrpcStatus(original);
    EXPECT_FALSE(g.ok());
    EXPECT_EQ(static_cast<int>(g.error_code()), c);
    EXPECT_EQ(g.error_message(), msg);
    const absl::Status back = FromGrpcStatus(g);
    EXPECT_EQ(back.code(), code);
    EXPECT_EQ(back.message(), msg);
    EXPECT_EQ(back, original);
  }
}

TEST(GrpcStatusTest, NamedCodesMatchBetweenLibraries) {
  // Spot-check that the numeric mapping is the intended one by name.
  EXPECT_EQ(ToGrpcStatus(absl::CancelledError("x")).error_code(),
            grpc::StatusCode::CANCELLED);
  EXPECT_EQ(ToGrpcStatus(absl::InvalidArgumentError("x")).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(ToGrpcStatus(absl::DeadlineExceededError("x")).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(ToGrpcStatus(absl::NotFoundError("x")).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(ToGrpcStatus(absl::FailedPreconditionError("x")).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(ToGrpcStatus(absl::ResourceExhaustedError("x")).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(ToGrpcStatus(absl::UnavailableError("x")).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(ToGrpcStatus(absl::DataLossError("x")).error_code(),
            grpc::StatusCode::DATA_LOSS);
  EXPECT_EQ(ToGrpcStatus(absl::UnauthenticatedError("x")).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::ABORTED, "y")),
            absl::AbortedError("y"));
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "y")),
            absl::UnimplementedError("y"));
}

TEST(GrpcStatusTest, EmptyMessageSurvives) {
  const absl::Status back =
      FromGrpcStatus(ToGrpcStatus(absl::Status(absl::StatusCode::kInternal, "")));
  EXPECT_EQ(back.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(back.message(), "");
}

TEST(IsLocalAddressTest, Local) {
  EXPECT_TRUE(IsLocalAddress("unix:/tmp/halka.sock"));
  EXPECT_TRUE(IsLocalAddress("unix:///run/halka/worker.sock"));
  EXPECT_TRUE(IsLocalAddress("localhost:50051"));
  EXPECT_TRUE(IsLocalAddress("127.0.0.1:50051"));
  EXPECT_TRUE(IsLocalAddress("127.0.1.1:1"));
  EXPECT_TRUE(IsLocalAddress("[::1]:50051"));
}

TEST(IsLocalAddressTest, NotLocal) {
  EXPECT_FALSE(IsLocalAddress("10.0.0.1:50051"));
  EXPECT_FALSE(IsLocalAddress("0.0.0.0:50051"));
  EXPECT_FALSE(IsLocalAddress("example.com:443"));
  EXPECT_FALSE(IsLocalAddress("192.168.1.127:50051"));
  EXPECT_FALSE(IsLocalAddress("[::]:50051"));
  EXPECT_FALSE(IsLocalAddress("[2001:db8::1]:50051"));
  EXPECT_FALSE(IsLocalAddress("localhostx.example.com:80"));
  EXPECT_FALSE(IsLocalAddress(""));
}

}  // namespace
}  // namespace halka
