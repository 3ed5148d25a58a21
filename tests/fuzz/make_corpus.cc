// Writes the seed corpora of tests/fuzz: valid frames of every kind and
// valid rendezvous request sequences, so that the fuzzers start from inputs
// that pass the parsers and get deep quickly.
//   halka_make_corpus tests/fuzz/corpus
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "halka/v1/rendezvous.pb.h"
#include "halka/v1/worker.pb.h"
#include "codec/frame_codec.h"

namespace {

void Write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string Flatten(const grpc::ByteBuffer& b, uint8_t pieces) {
  std::vector<grpc::Slice> slices;
  (void)b.Dump(&slices);
  std::string out(1, static_cast<char>(pieces));
  for (const auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

std::string Record(uint8_t kind, const google::protobuf::Message& m) {
  const std::string body = m.SerializeAsString();
  std::string out;
  out.push_back(static_cast<char>(kind));
  out.push_back(static_cast<char>(body.size() & 0xff));
  out.push_back(static_cast<char>((body.size() >> 8) & 0xff));
  return out + body;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string root = argc > 1 ? argv[1] : "tests/fuzz/corpus";
  namespace fs = std::filesystem;
  fs::create_directories(root + "/frame_decoder_fuzz");
  fs::create_directories(root + "/rendezvous_requests_fuzz");
  fs::create_directories(root + "/worker_requests_fuzz");

  std::vector<uint8_t> payload(64 * 8, 7);
  int i = 0;
  auto frame = [&](const halka::FrameMeta& m, size_t bytes) {
    Write(root + "/frame_decoder_fuzz/seed-" + std::to_string(i++),
          Flatten(halka::EncodeFrame(m, absl::MakeConstSpan(payload.data(), bytes)),
                  static_cast<uint8_t>(i % 3)));
  };
  halka::FrameMeta d;
  d.kind = halka::FrameKind::kData;
  d.generation = 1;
  d.op_seq = 3;
  d.phase = halka::Phase::kReduceScatter;
  d.step = 1;
  d.segment = 2;
  d.offset = 128;
  d.count = 16;
  frame(d, 64);
  d.dtype = halka::DType::kFloat64;
  d.phase = halka::Phase::kAllGather;
  d.op = halka::ReduceOp::kMax;
  frame(d, 128);
  d.dtype = halka::DType::kFloat16;
  d.phase = halka::Phase::kPsPush;
  frame(d, 32);
  halka::FrameMeta f;
  f.kind = halka::FrameKind::kFingerprint;
  f.generation = 2;
  f.op_seq = 9;
  f.fingerprint.op_seq = 9;
  f.fingerprint.kind = halka::OpKind::kAllReduce;
  f.fingerprint.count = 1000;
  f.fingerprint.op = halka::ReduceOp::kAvg;
  f.origin_rank = 1;
  f.sender_rank = 2;
  frame(f, 0);
  f.count = 4;  // eager: the buffer rides with the fingerprint
  frame(f, 16);
  halka::FrameMeta a;
  a.kind = halka::FrameKind::kAbort;
  a.op_seq = 4;
  a.abort_code = absl::StatusCode::kDeadlineExceeded;
  a.message = "rank 1: deadline";
  frame(a, 0);

  // Rendezvous: a job of two forming, heartbeating, one leaving; a PS.
  halka::v1::JoinRequest j;
  j.set_job_id("job");
  j.set_world_size(2);
  j.set_worker_id("w0");
  j.set_address("127.0.0.1:1");
  std::string seq = Record(0, j);
  j.set_worker_id("w1");
  j.set_address("127.0.0.1:2");
  j.set_requested_rank(1);
  j.set_has_requested_rank(true);
  seq += Record(0, j);
  halka::v1::HeartbeatRequest hb;
  hb.set_job_id("job");
  hb.set_worker_id("w0");
  seq += Record(1, hb);
  halka::v1::RingHealthRequest h;
  h.set_job_id("job");
  seq += Record(3, h);
  halka::v1::RegisterServerRequest rs;
  rs.set_job_id("job");
  rs.set_server_id("ps-0");
  rs.set_address("127.0.0.1:3");
  rs.set_shards(1);
  seq += Record(4, rs);
  halka::v1::LookupServersRequest ls;
  ls.set_job_id("job");
  seq += Record(5, ls);
  seq += Record(6, ls);
  halka::v1::LeaveRequest lv;
  lv.set_job_id("job");
  lv.set_worker_id("w1");
  seq += Record(2, lv);
  seq += Record(3, h);
  Write(root + "/rendezvous_requests_fuzz/seed-lifecycle", seq);
  Write(root + "/rendezvous_requests_fuzz/seed-join", Record(0, j));
  // Worker requests: [type byte][proto]; 0 = RunRequest, 1 = InlineRequest.
  {
    halka::v1::RunRequest run;
    run.mutable_spec()->set_kind(halka::v1::ALL_REDUCE);
    run.mutable_spec()->set_dtype(halka::v1::FLOAT32);
    run.mutable_spec()->set_op(halka::v1::SUM);
    run.mutable_spec()->set_count(1000);
    run.set_shm_name("/halka-123-0");
    run.set_shm_offset(64);
    run.set_shm_size(4096);
    Write(root + "/worker_requests_fuzz/seed-run",
          std::string(1, '\0') + run.SerializeAsString());
    halka::v1::InlineRequest in;
    in.mutable_spec()->set_kind(halka::v1::BROADCAST);
    in.mutable_spec()->set_dtype(halka::v1::INT64);
    in.mutable_spec()->set_count(3);
    in.mutable_spec()->set_root(2);
    in.set_data(std::string(24, 'x'));
    Write(root + "/worker_requests_fuzz/seed-inline",
          std::string(1, '\1') + in.SerializeAsString());
  }
  std::printf("corpus written under %s\n", root.c_str());
  return 0;
}
