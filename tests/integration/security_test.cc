// Transport security and job tokens against real gRPC on loopback: TLS and
// mutual TLS, tokens, a rogue peer during a running ring, certificate reload,
// and the limits on hostile input.
//
// Status codes a refused caller sees (documented in common/security.h):
//   no client certificate, one from another CA, or plaintext to a TLS
//   server: the handshake fails, gRPC reports UNAVAILABLE;
//   a missing or wrong token, or a token of another job: UNAUTHENTICATED
//   "unauthenticated".
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "common/security.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "gtest/gtest.h"
#include "halka/client.h"
#include "halka/local_cluster.h"
#include "halka/v1/rendezvous.grpc.pb.h"
#include "halka/v1/worker.grpc.pb.h"
#include "server/parameter_server.h"
#include "server/rendezvous_service.h"
#include "tests/testing/link_counts.h"
#include "tests/testing/run_ranks.h"
#include "codec/frame_codec.h"
#include "transport/tcp/wire_link.h"
#include "worker/worker_node.h"

namespace halka {
namespace {

namespace fs = std::filesystem;
using Metadata = std::map<std::string, std::string>;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A fresh directory of certificates from scripts/certs.sh.
std::string MakeCerts(const std::string& name) {
  const std::string dir =
      (fs::temp_directory_path() / absl::StrCat("halka-sec-", getpid(), "-", name))
          .string();
  fs::remove_all(dir);
  const std::string cmd = absl::StrCat("bash ", HALKA_SOURCE_DIR,
                                       "/scripts/certs.sh ", dir,
                                       " localhost >/dev/null");
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return dir;
}

// How a hand-made client connects: independent of the process's
// configuration (which the cluster under test uses).
struct ClientCreds {
  bool tls = false;
  std::string ca;    // trusted roots (file)
  std::string cert;  // client certificate (file), "" = none
  std::string key;
};

std::shared_ptr<grpc::Channel> HandChannel(const std::string& target,
                                           const ClientCreds& c) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  if (!c.tls) {
    return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(),
                                     args);
  }
  std::vector<grpc::experimental::IdentityKeyCertPair> pairs;
  if (!c.cert.empty()) pairs.push_back({ReadFile(c.key), ReadFile(c.cert)});
  grpc::experimental::TlsChannelCredentialsOptions o;
  o.set_certificate_provider(
      std::make_shared<grpc::experimental::StaticDataCertificateProvider>(
          ReadFile(c.ca), pairs));
  o.watch_root_certs();
  if (!c.cert.empty()) o.watch_identity_key_cert_pairs();
  return grpc::CreateCustomChannel(target, grpc::experimental::TlsCredentials(o),
                                   args);
}

void Prepare(grpc::ClientContext& ctx, const Metadata& md) {
  for (const auto& [k, v] : md) ctx.AddMetadata(k, v);
  SetTimeout(ctx, absl::Seconds(10));
}

Metadata Auth(const std::string& job, const std::string& token) {
  Metadata md;
  if (!job.empty()) md[kJobMetadata] = job;
  if (!token.empty()) md[kTokenMetadata] = token;
  return md;
}

grpc::Status Health(const std::shared_ptr<grpc::Channel>& ch, const Metadata& md,
                    const std::string& job) {
  auto stub = v1::Rendezvous::NewStub(ch);
  grpc::ClientContext ctx;
  Prepare(ctx, md);
  v1::RingHealthRequest req;
  req.set_job_id(job);
  v1::RingHealth reply;
  return stub->GetRingHealth(&ctx, req, &reply);
}

grpc::Status Join(const std::shared_ptr<grpc::Channel>& ch, const Metadata& md,
                  const std::string& job, int world_size = 4) {
  auto stub = v1::Rendezvous::NewStub(ch);
  grpc::ClientContext ctx;
  Prepare(ctx, md);
  v1::JoinRequest req;
  req.set_job_id(job);
  req.set_worker_id("intruder");
  req.set_address("127.0.0.1:1");
  req.set_world_size(world_size);
  req.set_wait_timeout_ms(200);
  v1::JoinReply reply;
  return stub->Join(&ctx, req, &reply);
}

grpc::Status WorkerInfo(const std::shared_ptr<grpc::Channel>& ch,
                        const Metadata& md) {
  auto stub = v1::Worker::NewStub(ch);
  grpc::ClientContext ctx;
  Prepare(ctx, md);
  v1::InfoRequest req;
  v1::InfoReply reply;
  return stub->GetInfo(&ctx, req, &reply);
}

grpc::Status GrpcHealthCheck(const std::shared_ptr<grpc::Channel>& ch) {
  grpc::GenericStub stub(ch);
  grpc::ClientContext ctx;
  SetTimeout(ctx, absl::Seconds(10));
  grpc::CompletionQueue cq;
  grpc::Slice empty("", 0);
  grpc::ByteBuffer req(&empty, 1);
  grpc::ByteBuffer reply;
  auto call = stub.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", req, &cq);
  call->StartCall();
  grpc::Status st;
  call->Finish(&reply, &st, reinterpret_cast<void*>(1));
  void* tag;
  bool ok;
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return st;
}

// Opens a raw stream (Peer.Link or ParameterServer.Reduce) and writes
// `frames` well-formed frames; returns the stream's final status.
grpc::Status RawStream(const std::shared_ptr<grpc::Channel>& ch,
                       const std::string& method, const Metadata& md,
                       const std::vector<FrameMeta>& frames) {
  grpc::GenericStub stub(ch);
  grpc::ClientContext ctx;
  Prepare(ctx, md);
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(&ctx, method, &cq);
  void* tag;
  bool ok = false;
  call->StartCall(reinterpret_cast<void*>(1));
  cq.Next(&tag, &ok);
  std::vector<float> payload(4096, 1.0f);
  for (const FrameMeta& m : frames) {
    if (!ok) break;
    grpc::ByteBuffer b = EncodeFrame(
        m, absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(payload.data()),
                               m.count * DTypeSize(m.dtype)));
    call->Write(b, reinterpret_cast<void*>(2));
    cq.Next(&tag, &ok);
  }
  if (ok) {
    call->WritesDone(reinterpret_cast<void*>(3));
    cq.Next(&tag, &ok);
  }
  grpc::Status st;
  call->Finish(&st, reinterpret_cast<void*>(4));
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return st;
}

// Frames a rogue sends: the fingerprint of the op the ring runs (op_seq,
// float32 x count, sum), then data for every segment of it.
std::vector<FrameMeta> StolenFrames(uint64_t op_seq, uint64_t count,
                                    uint64_t generation) {
  std::vector<FrameMeta> frames;
  FrameMeta fp;
  fp.kind = FrameKind::kFingerprint;
  fp.generation = generation;
  fp.op_seq = op_seq;
  fp.phase = Phase::kFingerprint;
  fp.fingerprint.op_seq = op_seq;
  fp.fingerprint.kind = OpKind::kAllReduce;
  fp.fingerprint.dtype = DType::kFloat32;
  fp.fingerprint.count = count;
  fp.fingerprint.op = ReduceOp::kSum;
  fp.fingerprint.algorithm = Algorithm::kRing;
  fp.origin_rank = 0;
  fp.sender_rank = 0;
  frames.push_back(fp);
  for (int seg = 0; seg < 4; ++seg) {
    FrameMeta d;
    d.kind = FrameKind::kData;
    d.generation = generation;
    d.op_seq = op_seq;
    d.phase = Phase::kReduceScatter;
    d.step = 0;
    d.segment = seg;
    d.offset = static_cast<uint64_t>(seg) * 1024;
    d.count = 1024;
    d.sender_rank = 0;
    frames.push_back(d);
  }
  return frames;
}

Metadata PeerMetadata(const std::string& job, const std::string& token,
                      uint64_t generation) {
  Metadata md = Auth(job, token);
  md["halka-job"] = job;
  md["halka-generation"] = absl::StrCat(generation);
  md["halka-rank"] = "0";
  md["halka-world-size"] = "4";
  return md;
}

// A cluster of `workers` whose job "local" has `token`.
absl::StatusOr<std::unique_ptr<LocalCluster>> TokenCluster(int workers,
                                                           const std::string& token) {
  LocalCluster::Options o;
  o.workers = workers;
  o.job_token = token;
  return LocalCluster::Start(o);
}

constexpr char kPeerLink[] = "/halka.v1.Peer/Link";
constexpr char kPsReduce[] = "/halka.v1.ParameterServer/Reduce";

// Every rank all-reduces rank-dependent integers (exact in float32); true
// when every element on every rank is the exact sum.
bool RingAllReduceCorrect(const LocalCluster& cluster, int ops, size_t count) {
  const int g = cluster.size();
  auto results = testing::RunRanks<bool>(g, [&](int r) {
    auto client = cluster.Connect(r);
    if (!client.ok()) {
      ADD_FAILURE() << client.status();
      return false;
    }
    for (int op = 0; op < ops; ++op) {
      std::vector<float> v(count);
      for (size_t i = 0; i < count; ++i) {
        v[i] = static_cast<float>((r + 1) * 1000 + static_cast<int>(i % 997) + op);
      }
      OpOptions o;
      o.algorithm = Algorithm::kRing;
      auto info = (*client)->AllReduce(absl::MakeSpan(v), ReduceOp::kSum, o);
      if (!info.ok()) {
        ADD_FAILURE() << "rank " << r << ": " << info.status();
        return false;
      }
      for (size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int k = 0; k < g; ++k) {
          want += static_cast<float>((k + 1) * 1000 + static_cast<int>(i % 997) + op);
        }
        if (v[i] != want) {
          ADD_FAILURE() << "rank " << r << " element " << i << ": " << v[i]
                        << " != " << want;
          return false;
        }
      }
    }
    return true;
  });
  for (bool ok : results) {
    if (!ok) return false;
  }
  return true;
}

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override { SetSecurityConfig(SecurityConfig()); }
  void TearDown() override { SetSecurityConfig(SecurityConfig()); }
};

TEST_F(SecurityTest, MutualTlsRefusesClientsWithoutTheJobsCertificate) {
  const std::string d = MakeCerts("mtls");
  LocalCluster::Options o;
  o.workers = 4;
  o.ps_shards = 1;
  o.tls_cert = d + "/localhost.pem";
  o.tls_key = d + "/localhost.key";
  o.tls_ca = d + "/ca.pem";
  o.job_token = "secret-token-A";
  auto cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const LocalCluster& c = **cluster;
  // The ring itself runs over mutual TLS with tokens.
  EXPECT_TRUE(RingAllReduceCorrect(c, 2, 1 << 14));

  const std::string rv = c.rendezvous_address();
  const std::string w0 = c.worker_address(0);
  const std::string ps = c.ps(0)->address();
  const Metadata good = Auth("local", "secret-token-A");
  const Metadata peer_good = PeerMetadata("local", "secret-token-A", 99);

  const ClientCreds plaintext{};
  const ClientCreds no_cert{true, d + "/ca.pem", "", ""};
  const ClientCreds rogue_cert{true, d + "/ca.pem", d + "/rogue.pem", d + "/rogue.key"};
  for (const ClientCreds& bad : {plaintext, no_cert, rogue_cert}) {
    SCOPED_TRACE(bad.tls ? (bad.cert.empty() ? "no client cert" : "rogue CA cert")
                         : "plaintext");
    EXPECT_EQ(Join(HandChannel(rv, bad), good, "local").error_code(),
              grpc::StatusCode::UNAVAILABLE);
    EXPECT_EQ(Health(HandChannel(rv, bad), good, "local").error_code(),
              grpc::StatusCode::UNAVAILABLE);
    EXPECT_EQ(WorkerInfo(HandChannel(w0, bad), good).error_code(),
              grpc::StatusCode::UNAVAILABLE);
    EXPECT_EQ(RawStream(HandChannel(w0, bad), kPeerLink, peer_good,
                        StolenFrames(1, 4096, 1))
                  .error_code(),
              grpc::StatusCode::UNAVAILABLE);
    EXPECT_EQ(RawStream(HandChannel(ps, bad), kPsReduce, peer_good, {})
                  .error_code(),
              grpc::StatusCode::UNAVAILABLE);
    EXPECT_EQ(GrpcHealthCheck(HandChannel(w0, bad)).error_code(),
              grpc::StatusCode::UNAVAILABLE);
  }

  // The job's certificate but no token, or a wrong one: UNAUTHENTICATED,
  // with a message that does not say which part was wrong.
  const ClientCreds cert{true, d + "/ca.pem", d + "/localhost.pem", d + "/localhost.key"};
  for (const Metadata& md : {Auth("", ""), Auth("local", ""), Auth("local", "wrong"),
                             Auth("", "secret-token-A-but-longer")}) {
    grpc::Status s = Join(HandChannel(rv, cert), md, "local");
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(s.error_message(), "unauthenticated");
    EXPECT_EQ(Health(HandChannel(rv, cert), md, "local").error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(WorkerInfo(HandChannel(w0, cert), md).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    Metadata peer = PeerMetadata("local", "", 1);
    for (const auto& kv : md) peer[kv.first] = kv.second;
    if (md.count(kTokenMetadata) == 0) peer.erase(kTokenMetadata);
    peer["halka-job"] = "local";
    EXPECT_EQ(RawStream(HandChannel(w0, cert), kPeerLink, peer,
                        StolenFrames(1, 4096, 1))
                  .error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(RawStream(HandChannel(ps, cert), kPsReduce, peer, {}).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  // Certificate and token: served (health) or refused for what the request
  // is, never for who sent it.
  EXPECT_TRUE(Health(HandChannel(rv, cert), good, "local").ok());
  EXPECT_TRUE(WorkerInfo(HandChannel(w0, cert), good).ok());
  const grpc::StatusCode stale = RawStream(HandChannel(w0, cert), kPeerLink,
                                           peer_good, StolenFrames(1, 4096, 99))
                                     .error_code();
  EXPECT_NE(stale, grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(stale, grpc::StatusCode::UNAVAILABLE);
  // The standard health service needs the certificate but no token
  // (probes carry none).
  EXPECT_TRUE(GrpcHealthCheck(HandChannel(w0, cert)).ok());
  // The ring is unharmed.
  EXPECT_TRUE(RingAllReduceCorrect(c, 1, 1 << 14));
}

// The answer a worker gives to a wire offer on a peer link (initial
// metadata "halka-wire"); the call is cancelled after it.
std::string WireAnswer(const std::shared_ptr<grpc::Channel>& ch, Metadata md,
                       const std::string& offer) {
  md[kLinkWireOfferKey] = offer;
  grpc::GenericStub stub(ch);
  grpc::ClientContext ctx;
  Prepare(ctx, md);
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(&ctx, kPeerLink, &cq);
  void* tag;
  bool ok = false;
  call->StartCall(reinterpret_cast<void*>(1));
  cq.Next(&tag, &ok);
  std::string answer = "(no answer)";
  if (ok) {
    call->ReadInitialMetadata(reinterpret_cast<void*>(2));
    cq.Next(&tag, &ok);
    const auto& got = ctx.GetServerInitialMetadata();
    auto it = got.find(kLinkWireAnswerKey);
    if (ok && it != got.end()) answer.assign(it->second.data(), it->second.size());
  }
  ctx.TryCancel();
  grpc::Status st;
  call->Finish(&st, reinterpret_cast<void*>(3));
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return answer;
}

// Between hosts (no shared memory) under mutual TLS, links take wire
// connections whose records are sealed; a worker that serves TLS refuses
// a plaintext wire offer, and answers a sealed one with a port and a token.
TEST_F(SecurityTest, UnderMutualTlsWireLinksAreSealedAndPlaintextOnesRefused) {
  const std::string d = MakeCerts("wire");
  LocalCluster::Options o;
  o.workers = 3;
  o.shm_links = false;
  o.tls_cert = d + "/localhost.pem";
  o.tls_key = d + "/localhost.key";
  o.tls_ca = d + "/ca.pem";
  o.job_token = "secret-token-W";
  auto cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const LocalCluster& c = **cluster;
  EXPECT_TRUE(RingAllReduceCorrect(c, 3, (1 << 18) + 3));
  const halka::testing::LinkCounts links = halka::testing::CountsOf(c);
  EXPECT_GE(links.wire_accepted, 3u);
  EXPECT_EQ(links.wire_fell_back, 0u);

  const ClientCreds cert{true, d + "/ca.pem", d + "/localhost.pem",
                         d + "/localhost.key"};
  absl::StatusOr<v1::InfoReply> info = c.worker(0)->Describe();
  ASSERT_TRUE(info.ok()) << info.status();
  const Metadata peer = PeerMetadata("local", "secret-token-W",
                                     info->membership_generation());
  const std::string w0 = c.worker_address(0);
  EXPECT_EQ(WireAnswer(HandChannel(w0, cert), peer, "-"),
            "no: this worker serves TLS: a wire link must be sealed");
  EXPECT_EQ(WireAnswer(HandChannel(w0, cert), peer, "aes-128-ocb:nothex"),
            "no: malformed key");
  // An older halka's offer (an AES-GCM key, bare hex): refused, and that
  // link stays on its gRPC stream.
  EXPECT_EQ(WireAnswer(HandChannel(w0, cert), peer,
                       WireHex(std::string(16, 'k'))),
            "no: this worker seals wire links with aes-128-ocb and takes no "
            "other offer");
  int port = 0;
  std::string token;
  const std::string sealed = WireAnswer(HandChannel(w0, cert), peer,
                                        FormatWireOffer(std::string(16, 'k')));
  EXPECT_TRUE(ParseWireAnswer(sealed, &port, &token)) << sealed;
  EXPECT_TRUE(RingAllReduceCorrect(c, 1, 1 << 14));
}

TEST_F(SecurityTest, TlsWithoutCaServesAnyClientButChecksTheServer) {
  const std::string d = MakeCerts("tls");
  // TLS without a CA on the server: no client certificate asked for.
  SecurityConfig sec;
  sec.tls_cert = d + "/localhost.pem";
  sec.tls_key = d + "/localhost.key";
  SetSecurityConfig(sec);
  auto rv = RendezvousServer::Start("127.0.0.1:0", RendezvousOptions(), 0);
  ASSERT_TRUE(rv.ok()) << rv.status();
  const std::string addr = (*rv)->address();
  const ClientCreds no_cert{true, d + "/ca.pem", "", ""};
  EXPECT_EQ(Health(HandChannel(addr, no_cert), Auth("j", "t"), "j").error_code(),
            grpc::StatusCode::NOT_FOUND);  // served: no such job
  EXPECT_EQ(Health(HandChannel(addr, ClientCreds{}), Auth("j", "t"), "j").error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // A client that trusts another CA refuses the server.
  const ClientCreds wrong_roots{true, d + "/rogue-ca.pem", "", ""};
  EXPECT_EQ(Health(HandChannel(addr, wrong_roots), Auth("j", "t"), "j").error_code(),
            grpc::StatusCode::UNAVAILABLE);
  (*rv)->Shutdown();
}

TEST_F(SecurityTest, RoguePeerWithStolenFingerprintIsRefusedAndRingStaysCorrect) {
  auto cluster = TokenCluster(4, "token-of-job-local");
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const LocalCluster& c = **cluster;
  std::atomic<bool> done{false};
  std::atomic<int> refused{0}, accepted{0};
  std::thread rogue([&] {
    uint64_t seq = 1;
    do {  // at least one full round, however fast the ring is
      for (int r = 0; r < c.size(); ++r) {
        for (const std::string& token : {std::string(), std::string("guess")}) {
          grpc::Status s = RawStream(HandChannel(c.worker_address(r), {}), kPeerLink,
                                     PeerMetadata("local", token, 1),
                                     StolenFrames(seq, 1 << 14, 1));
          if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
            ++refused;
          } else {
            ++accepted;
            ADD_FAILURE() << "rogue stream to rank " << r << " ended with "
                          << s.error_code() << " " << s.error_message();
          }
        }
      }
      seq = seq % 16 + 1;
    } while (!done.load());
  });
  const bool correct = RingAllReduceCorrect(c, 16, 1 << 16);
  done = true;
  rogue.join();
  EXPECT_TRUE(correct);
  EXPECT_GT(refused.load(), 0);
  EXPECT_EQ(accepted.load(), 0);
}

TEST_F(SecurityTest, JobTokensBindCallsToTheirJob) {
  auto cluster = TokenCluster(2, "token-A");
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto rv = HandChannel((*cluster)->rendezvous_address(), {});
  // Job A's own token works; with the job named in the request only, too.
  EXPECT_TRUE(Health(rv, Auth("local", "token-A"), "local").ok());
  EXPECT_TRUE(Health(rv, Auth("", "token-A"), "local").ok());
  EXPECT_EQ(Health(rv, Auth("", "token-B"), "local").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // Job B appears with its own token (its first call fixes it).
  EXPECT_EQ(Health(rv, Auth("B", "token-B"), "B").error_code(),
            grpc::StatusCode::NOT_FOUND);
  // A worker of job A cannot act for job B: neither with B's name in the
  // metadata and A's token, nor with A's credentials and B in the request.
  EXPECT_EQ(Join(rv, Auth("B", "token-A"), "B").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Join(rv, Auth("local", "token-A"), "B").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Join(rv, Auth("", "token-A"), "B").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // Nor send into A's ring with B's credentials.
  EXPECT_EQ(RawStream(HandChannel((*cluster)->worker_address(0), {}), kPeerLink,
                      PeerMetadata("B", "token-B", 1), StolenFrames(1, 4096, 1))
                .error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(WorkerInfo(HandChannel((*cluster)->worker_address(0), {}),
                       Auth("B", "token-A"))
                .error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(SecurityTest, TokensFileListsTheOnlyJobsThatMayCall) {
  const std::string path =
      (fs::temp_directory_path() / absl::StrCat("halka-sec-", getpid(), "-tokens"))
          .string();
  std::ofstream(path) << "# job token\nalpha tok-alpha\nbeta\ttok-beta\n";
  SecurityConfig sec;
  sec.job_tokens_file = path;
  SetSecurityConfig(sec);
  auto rv = RendezvousServer::Start("127.0.0.1:0", RendezvousOptions(), 0);
  ASSERT_TRUE(rv.ok()) << rv.status();
  auto ch = HandChannel((*rv)->address(), {});
  EXPECT_EQ(Health(ch, Auth("alpha", "tok-alpha"), "alpha").error_code(),
            grpc::StatusCode::NOT_FOUND);  // allowed; no such job yet
  EXPECT_EQ(Health(ch, Auth("", "tok-beta"), "beta").error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Health(ch, Auth("alpha", "tok-beta"), "alpha").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // Unlisted jobs cannot call at all, with or without a token.
  EXPECT_EQ(Health(ch, Auth("gamma", "anything"), "gamma").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Join(ch, Auth("", ""), "gamma", 1).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  (*rv)->Shutdown();
  // --require_job_tokens: first use still fixes a job's token, but never an
  // empty one.
  SecurityConfig require;
  require.require_job_tokens = true;
  SetSecurityConfig(require);
  rv = RendezvousServer::Start("127.0.0.1:0", RendezvousOptions(), 0);
  ASSERT_TRUE(rv.ok()) << rv.status();
  ch = HandChannel((*rv)->address(), {});
  EXPECT_EQ(Health(ch, Auth("delta", ""), "delta").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Health(ch, Auth("delta", "tok-delta"), "delta").error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Health(ch, Auth("delta", "other"), "delta").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  (*rv)->Shutdown();
  fs::remove(path);
}

TEST(ConstantTimeEqualsTest, ComparesWholeStrings) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("token", "token"));
  EXPECT_FALSE(ConstantTimeEquals("token", "tokeN"));
  EXPECT_FALSE(ConstantTimeEquals("token", "token2"));
  EXPECT_FALSE(ConstantTimeEquals("token", ""));
  EXPECT_FALSE(ConstantTimeEquals(std::string("a\0", 2), "a"));
}

TEST_F(SecurityTest, PlaintextOffLoopbackNeedsInsecure) {
  auto refused = ServerCredentialsFor("0.0.0.0:0");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(ServerCredentialsFor("127.0.0.1:0").ok());
  EXPECT_TRUE(ServerCredentialsFor("localhost:0").ok());
  EXPECT_TRUE(ServerCredentialsFor("[::1]:0").ok());
  EXPECT_TRUE(ServerCredentialsFor("unix:/tmp/halka-x.sock").ok());
  auto rv = RendezvousServer::Start("0.0.0.0:0", RendezvousOptions(), 0);
  EXPECT_EQ(rv.status().code(), absl::StatusCode::kFailedPrecondition);
  SecurityConfig insecure;
  insecure.insecure = true;
  SetSecurityConfig(insecure);
  EXPECT_TRUE(ServerCredentialsFor("0.0.0.0:0").ok());
  SecurityConfig half;
  half.tls_cert = "/nonexistent/cert.pem";
  SetSecurityConfig(half);
  EXPECT_EQ(ServerCredentialsFor("127.0.0.1:0").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Copies the CA, certificate and key of `from` into `live` (created if
// needed), each by an atomic rename, as a certificate rotation would.
void InstallCerts(const std::string& from, const std::string& live) {
  fs::create_directories(live);
  for (const char* f : {"ca.pem", "localhost.pem", "localhost.key"}) {
    fs::copy_file(absl::StrCat(from, "/", f), absl::StrCat(live, "/", f, ".new"),
                  fs::copy_options::overwrite_existing);
    fs::rename(absl::StrCat(live, "/", f, ".new"), absl::StrCat(live, "/", f));
  }
}

std::string LiveCertDir(const std::string& name) {
  const std::string live =
      (fs::temp_directory_path() / absl::StrCat("halka-sec-", getpid(), "-", name))
          .string();
  fs::remove_all(live);
  return live;
}

TEST_F(SecurityTest, CertificatesReloadWithoutRestart) {
  const std::string set1 = MakeCerts("reload1");
  const std::string set2 = MakeCerts("reload2");
  const std::string live = LiveCertDir("live");
  auto install = [&](const std::string& from) { InstallCerts(from, live); };
  install(set1);
  SecurityConfig sec;
  sec.tls_cert = live + "/localhost.pem";
  sec.tls_key = live + "/localhost.key";
  sec.tls_ca = live + "/ca.pem";
  sec.tls_reload_interval = absl::Seconds(1);
  SetSecurityConfig(sec);
  auto rv = RendezvousServer::Start("127.0.0.1:0", RendezvousOptions(), 0);
  ASSERT_TRUE(rv.ok()) << rv.status();
  const std::string addr = (*rv)->address();
  auto creds_of = [](const std::string& d) {
    return ClientCreds{true, d + "/ca.pem", d + "/localhost.pem", d + "/localhost.key"};
  };
  auto code = [&](const std::string& d) {
    return Health(HandChannel(addr, creds_of(d)), Auth("j", ""), "j").error_code();
  };
  EXPECT_EQ(code(set1), grpc::StatusCode::NOT_FOUND);  // served
  EXPECT_EQ(code(set2), grpc::StatusCode::UNAVAILABLE);
  install(set2);
  // New handshakes use the new files once the watcher has read them.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  grpc::StatusCode now = code(set2);
  while (now != grpc::StatusCode::NOT_FOUND && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(250));
    now = code(set2);
  }
  EXPECT_EQ(now, grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(code(set1), grpc::StatusCode::UNAVAILABLE);
  (*rv)->Shutdown();
}

// Opens `n` streams of `method` at once on one channel (one connection),
// each sending `request` (if not empty) and then waiting for the server to
// end it. Returns the statuses of the streams the server ended within
// `wait`, then cancels the others and waits for them.
std::vector<grpc::Status> OpenManyStreams(const std::shared_ptr<grpc::Channel>& ch,
                                          const std::string& method,
                                          const Metadata& md,
                                          const std::string& request, int n,
                                          absl::Duration wait) {
  grpc::GenericStub stub(ch);
  grpc::CompletionQueue cq;
  struct S {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call;
    grpc::Status status;
  };
  std::vector<std::unique_ptr<S>> streams;
  // Tags: 3 * i + 0 start, + 1 the request written, + 2 finished.
  for (int i = 0; i < n; ++i) {
    auto st = std::make_unique<S>();
    Prepare(st->ctx, md);
    st->call = stub.PrepareCall(&st->ctx, method, &cq);
    st->call->StartCall(reinterpret_cast<void*>(static_cast<intptr_t>(3 * i)));
    streams.push_back(std::move(st));
  }
  int pending = 0;  // operations the queue still owes us
  std::vector<grpc::Status> ended;
  std::vector<bool> done(static_cast<size_t>(n), false);
  auto handle = [&](void* tag, bool ok) {
    --pending;
    const intptr_t t = reinterpret_cast<intptr_t>(tag);
    S& st = *streams[static_cast<size_t>(t / 3)];
    if (t % 3 == 0 && ok && !request.empty()) {
      grpc::Slice slice(request);
      grpc::ByteBuffer b(&slice, 1);
      st.call->Write(b, reinterpret_cast<void*>(t + 1));
      ++pending;
    } else if (t % 3 == 2) {
      done[static_cast<size_t>(t / 3)] = true;
    }
  };
  pending = n;
  for (int i = 0; i < n; ++i) {
    streams[static_cast<size_t>(i)]->call->Finish(
        &streams[static_cast<size_t>(i)]->status,
        reinterpret_cast<void*>(static_cast<intptr_t>(3 * i + 2)));
    ++pending;
  }
  const absl::Time until = absl::Now() + wait;
  void* tag;
  bool ok;
  while (absl::Now() < until) {
    auto r = cq.AsyncNext(&tag, &ok, absl::ToChronoTime(until));
    if (r != grpc::CompletionQueue::GOT_EVENT) break;
    handle(tag, ok);
  }
  for (int i = 0; i < n; ++i) {
    if (done[static_cast<size_t>(i)]) {
      ended.push_back(streams[static_cast<size_t>(i)]->status);
    } else {
      streams[static_cast<size_t>(i)]->ctx.TryCancel();
    }
  }
  while (pending > 0 && cq.Next(&tag, &ok)) handle(tag, ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return ended;
}

TEST_F(SecurityTest, ConcurrentStreamsPastTheLimitAreRefusedAtOnce) {
  auto cluster = TokenCluster(2, "t");
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const LocalCluster& c = **cluster;
  // Peer links: 64 per connection; the 65th ends at once, the others stay.
  auto peer = HandChannel(c.worker_address(0), {});
  std::vector<grpc::Status> ended = OpenManyStreams(
      peer, kPeerLink, PeerMetadata("local", "t", 1), "", 65, absl::Seconds(3));
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(ended[0].error_message().find(
                "too many open peer link streams from ipv4:127.0.0.1:"),
            std::string::npos) << ended[0].error_message();
  EXPECT_NE(ended[0].error_message().find("(at most 64 per connection)"),
            std::string::npos) << ended[0].error_message();
  // Closed streams are forgotten: the same connection opens links again.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  grpc::Status again;
  do {
    again = RawStream(peer, kPeerLink, PeerMetadata("local", "t", 1), {});
  } while (!again.ok() && absl::Now() < deadline);
  EXPECT_TRUE(again.ok()) << again.error_code() << " " << again.error_message();

  // Rendezvous watches: 8 per connection.
  v1::WatchRequest watch;
  watch.set_job_id("local");
  ended = OpenManyStreams(HandChannel(c.rendezvous_address(), {}),
                          "/halka.v1.Rendezvous/Watch", Auth("local", "t"),
                          watch.SerializeAsString(), 9, absl::Seconds(3));
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(ended[0].error_message().find("(at most 8 per connection)"),
            std::string::npos) << ended[0].error_message();
  // The ring still works.
  EXPECT_TRUE(RingAllReduceCorrect(c, 2, 1 << 12));
}

// Runs a shell command; returns its exit status and standard output.
std::pair<int, std::string> Shell(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return {-1, out};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST_F(SecurityTest, MetricsPortIsHttpsWithClientCertificatesUnderTls) {
  if (Shell("command -v curl").first != 0) GTEST_SKIP() << "no curl";
  const std::string d = MakeCerts("https");
  const std::string d2 = MakeCerts("https2");
  const std::string live = LiveCertDir("https-live");
  InstallCerts(d, live);
  SecurityConfig sec;
  sec.tls_cert = live + "/localhost.pem";
  sec.tls_key = live + "/localhost.key";
  sec.tls_ca = live + "/ca.pem";
  SetSecurityConfig(sec);
  auto rv = RendezvousServer::Start("127.0.0.1:0", RendezvousOptions(), -1);
  ASSERT_TRUE(rv.ok()) << rv.status();
  const std::string at = (*rv)->metrics_address();
  ASSERT_FALSE(at.empty());
  auto curl = [&](const std::string& scheme, const std::string& args) {
    return Shell(absl::StrCat("curl -sS --max-time 5 ", args, " ", scheme, "://",
                              at, "/metrics 2>&1"));
  };
  const std::string ca = absl::StrCat("--cacert ", d, "/ca.pem");
  // The job's CA and a certificate it signed: served.
  auto [rc, out] = curl("https", absl::StrCat(ca, " --cert ", d, "/localhost.pem --key ",
                                              d, "/localhost.key"));
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("# TYPE halka_"), std::string::npos) << out.substr(0, 300);
  // No client certificate, one of another CA, or plain HTTP: nothing.
  for (const std::string& args :
       {ca, absl::StrCat(ca, " --cert ", d, "/rogue.pem --key ", d, "/rogue.key")}) {
    auto [bad_rc, bad_out] = curl("https", args);
    EXPECT_NE(bad_rc, 0) << args;
    EXPECT_EQ(bad_out.find("# TYPE"), std::string::npos) << bad_out.substr(0, 300);
  }
  auto [plain_rc, plain_out] = curl("http", "");
  EXPECT_NE(plain_rc, 0);
  EXPECT_EQ(plain_out.find("# TYPE"), std::string::npos) << plain_out.substr(0, 300);
  // Rotation to another CA and certificate, without a restart: new
  // connections use the new files (looked at, at most once a second).
  InstallCerts(d2, live);
  auto creds = [](const std::string& dir) {
    return absl::StrCat("--cacert ", dir, "/ca.pem --cert ", dir, "/localhost.pem --key ",
                        dir, "/localhost.key");
  };
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  int rc2 = curl("https", creds(d2)).first;
  while (rc2 != 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(250));
    rc2 = curl("https", creds(d2)).first;
  }
  EXPECT_EQ(rc2, 0) << "the rotated certificate is not used";
  // The server's new certificate is trusted, but the client's is from the
  // old CA, which the server no longer accepts.
  EXPECT_NE(curl("https", absl::StrCat("--cacert ", d2, "/ca.pem --cert ", d,
                                       "/localhost.pem --key ", d, "/localhost.key"))
                .first,
            0)
      << "a client certificate of the old CA is still accepted";
  (*rv)->Shutdown();
}

TEST_F(SecurityTest, HostileInputLimits) {
  RendezvousOptions ro;
  ro.max_jobs = 1;
  ro.max_world_size = 8;
  auto rv = RendezvousServer::Start("127.0.0.1:0", ro, 0);
  ASSERT_TRUE(rv.ok()) << rv.status();
  auto ch = HandChannel((*rv)->address(), {});
  // One job fits; a second is refused.
  EXPECT_TRUE(Join(ch, {}, "first", 1).ok());
  grpc::Status s = Join(ch, {}, "second", 1);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find("jobs"), std::string::npos) << s.error_message();
  // Members per job.
  s = Join(ch, {}, "first", 9);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find("members per job"), std::string::npos)
      << s.error_message();
  // A message over the size limit never reaches a handler.
  {
    auto stub = v1::Rendezvous::NewStub(ch);
    grpc::ClientContext ctx;
    SetTimeout(ctx, absl::Seconds(30));
    v1::JoinRequest req;
    req.set_job_id("first");
    req.set_worker_id(std::string(static_cast<size_t>(kMaxMessageBytes) + 1, 'x'));
    v1::JoinReply reply;
    EXPECT_EQ(stub->Join(&ctx, req, &reply).error_code(),
              grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  (*rv)->Shutdown();
}

}  // namespace
}  // namespace halka
