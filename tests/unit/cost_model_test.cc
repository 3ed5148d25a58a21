// The latency-bandwidth model (core/cost_model.h) against figures worked
// out by hand from docs/scaling.md's table: each algorithm's steps and
// bytes, the level a flat algorithm moves at, two-level's two levels, what
// the model cannot predict, and the choice it makes as alpha or the size
// changes; its text form (--link_model); and auto ranking by a job's
// model (ResolveAlgorithm with CommConfig::link_model).
#include "core/cost_model.h"

#include "core/algorithms/algorithms.h"
#include "core/comm_types.h"
#include "core/frame.h"
#include "gtest/gtest.h"

namespace halka {
namespace {

constexpr double kTol = 1e-12;

LinkModel OneLevel(double alpha_s, double bytes_per_s) {
  LinkModel m;
  m.local = LevelCost{alpha_s, bytes_per_s};
  m.net = m.local;
  return m;
}

// Inside a host: 1 us, 10 GB/s; between hosts: 100 us, 1 GB/s.
LinkModel TwoLevels() {
  LinkModel m;
  m.local = LevelCost{1e-6, 1e10};
  m.net = LevelCost{1e-4, 1e9};
  return m;
}

// The data phase: what the formulas below work out. PredictSeconds adds
// the fingerprint pass to it (checked apart, FingerprintPass... below).
double Predict(const RingShape& shape, OpKind kind, Algorithm a, double s,
               const LinkModel& m) {
  std::optional<double> t = PredictSeconds(shape, kind, a, s, m);
  std::optional<double> pass = FingerprintPassSeconds(shape, kind, a, m);
  EXPECT_TRUE(t.has_value()) << AlgorithmName(a);
  EXPECT_TRUE(pass.has_value()) << AlgorithmName(a);
  return t.value_or(-1) - pass.value_or(0);
}

// Before the data, the ranks agree on what they run: one hop at the level a
// flat algorithm moves at, except recursive doubling's all-reduce, whose
// data frames carry the fingerprints.
TEST(CostModel, TheFingerprintPassIsOneHopExceptWhereTheDataCarriesIt) {
  const LinkModel m = TwoLevels();
  const RingShape hosts{8, {2, 2, 2, 2}};
  for (Algorithm a : {Algorithm::kRing, Algorithm::kTwoLevel, Algorithm::kTree,
                      Algorithm::kNaive}) {
    EXPECT_DOUBLE_EQ(
        *FingerprintPassSeconds(hosts, OpKind::kAllReduce, a, m), 1e-4)
        << AlgorithmName(a);
    EXPECT_NEAR(*PredictSeconds(hosts, OpKind::kAllReduce, a, 4096, m),
                Predict(hosts, OpKind::kAllReduce, a, 4096, m) + 1e-4, kTol);
  }
  EXPECT_EQ(*FingerprintPassSeconds(hosts, OpKind::kAllReduce,
                                    Algorithm::kRecursiveDoubling, m),
            0.0);
  // On one host at the local level; one rank has nothing to agree on.
  EXPECT_DOUBLE_EQ(*FingerprintPassSeconds(RingShape{4, {4}},
                                           OpKind::kReduceScatter,
                                           Algorithm::kRing, m),
                   1e-6);
  EXPECT_EQ(*FingerprintPassSeconds(RingShape{1, {1}}, OpKind::kAllReduce,
                                    Algorithm::kRing, m),
            0.0);
  EXPECT_FALSE(FingerprintPassSeconds(hosts, OpKind::kAllReduce,
                                      Algorithm::kRing, LinkModel{}));
  // So at 4 KiB between hosts 100 us apart, naive's one data hop costs
  // two with its pass, and recursive doubling's rounds carry theirs.
  EXPECT_NEAR(*PredictSeconds(hosts, OpKind::kAllReduce, Algorithm::kNaive,
                              4096, m),
              2e-4 + 2 * 6 * 4096 / 1e9, kTol);
}

TEST(CostModel, FlatAllReducesOnOneHost) {
  const RingShape one_host{4, {4}};
  const LinkModel m = OneLevel(10e-6, 1e9);
  const double s = 4e6;
  // 2(G-1) steps of S/G.
  EXPECT_NEAR(Predict(one_host, OpKind::kAllReduce, Algorithm::kRing, s, m),
              6 * (10e-6 + 1e6 / 1e9), kTol);
  // log2 4 = 2 swaps of the whole buffer.
  EXPECT_NEAR(Predict(one_host, OpKind::kAllReduce,
                      Algorithm::kRecursiveDoubling, s, m),
              2 * (10e-6 + 4e6 / 1e9), kTol);
  // One hop, G-1 copies through one link.
  EXPECT_NEAR(Predict(one_host, OpKind::kAllReduce, Algorithm::kNaive, s, m),
              10e-6 + 3 * 4e6 / 1e9, kTol);
  // The double binary tree of 4 (tree 0's children 2i+1, 2i+2, tree 1
  // its mirror): 2 ceil(log2 4) hops, the first chunk (1 MiB) stored and
  // forwarded at each but the last; every node has 3 edges in the two
  // trees, half the buffer each: 1.5 S. Of 5, node 1 has a parent and two
  // children in tree 0 and is a leaf of tree 1: 2 S.
  constexpr double kChunk = 1 << 20;
  EXPECT_NEAR(Predict(one_host, OpKind::kAllReduce, Algorithm::kTree, s, m),
              4 * 10e-6 + 3 * kChunk / 1e9 + 1.5 * 4e6 / 1e9, kTol);
  EXPECT_NEAR(Predict(RingShape{5, {5}}, OpKind::kAllReduce, Algorithm::kTree,
                      s, m),
              6 * 10e-6 + 5 * kChunk / 1e9 + 2 * 4e6 / 1e9, kTol);
  // Under two chunks (2 MiB) tree 0 alone carries the buffer, in one chunk
  // up to 1 MiB: each of the 6 hops stores and forwards it, and node 1's
  // parent and two children make its link the busiest, 3 S.
  EXPECT_NEAR(Predict(RingShape{5, {5}}, OpKind::kAllReduce, Algorithm::kTree,
                      1e6, m),
              6 * 10e-6 + 5 * 1e6 / 1e9 + 3 * 1e6 / 1e9, kTol);
  // 6 ranks: 4 is the largest power of two; 2 swaps and the fold in and out.
  EXPECT_NEAR(Predict(RingShape{6, {6}}, OpKind::kAllReduce,
                      Algorithm::kRecursiveDoubling, s, m),
              4 * (10e-6 + 4e6 / 1e9), kTol);
  // One rank: nothing moves.
  EXPECT_EQ(Predict(RingShape{1, {1}}, OpKind::kAllReduce, Algorithm::kRing,
                    s, m),
            0.0);
}

TEST(CostModel, FlatAlgorithmsOnSeveralHostsMoveAtTheNetLevel) {
  const RingShape hosts{4, {2, 2}};
  const LinkModel m = TwoLevels();
  // On hosts the ring runs in host order: each host's NIC carries one edge
  // each way, every step's S/G (here the bound: 1 ms a step, against the
  // cycle's (2 net hops + 2 local) / 4 = 0.6 ms).
  EXPECT_NEAR(Predict(hosts, OpKind::kAllReduce, Algorithm::kRing, 4e6, m),
              6 * (1e6 / 1e9), kTol);
  // A small buffer is bound by the cycle: of 8 ranks on 4 hosts, a step's
  // hop is a net one 4 times in 8. Charging every step a net hop would
  // predict twice that.
  EXPECT_NEAR(
      Predict(RingShape{8, {2, 2, 2, 2}}, OpKind::kAllReduce, Algorithm::kRing,
              8e3, m),
      14 * (4 * (1e-4 + 1e3 / 1e9) + 4 * (1e-6 + 1e3 / 1e10)) / 8, kTol);
  // Of 6 ranks on 2 hosts of 3, 2 net hops in 6.
  EXPECT_NEAR(
      Predict(RingShape{6, {3, 3}}, OpKind::kAllReduce, Algorithm::kRing,
              6e3, m),
      10 * (2 * (1e-4 + 1e3 / 1e9) + 4 * (1e-6 + 1e3 / 1e10)) / 6, kTol);
  // On one host the same ring moves at the local level.
  EXPECT_NEAR(Predict(RingShape{4, {4}}, OpKind::kAllReduce, Algorithm::kRing,
                      4e6, m),
              6 * (1e-6 + 1e6 / 1e10), kTol);
  // Hosts not known (a group's ring): the net level, not the local one.
  EXPECT_NEAR(Predict(RingShape{4, {}}, OpKind::kAllReduce, Algorithm::kRing,
                      4e6, m),
              6 * (1e-4 + 1e6 / 1e9), kTol);
  // A model of one level: that level, wherever the ranks are.
  EXPECT_NEAR(Predict(RingShape{4, {4}}, OpKind::kAllReduce, Algorithm::kRing,
                      4e6, LinkModel{LevelCost{}, m.net}),
              6 * (1e-4 + 1e6 / 1e9), kTol);
  LinkModel net_only;
  net_only.net = m.net;
  EXPECT_NEAR(Predict(RingShape{4, {}}, OpKind::kAllReduce, Algorithm::kRing,
                      4e6, net_only),
              6 * (1e-4 + 1e6 / 1e9), kTol);
}

// Where a host's ranks send across hosts at once, its NIC carries them all.
TEST(CostModel, NaiveAndRecursiveDoublingOnHostsShareTheHostsNic) {
  const LinkModel m = TwoLevels();
  const double s = 4e6;
  // 2 x 4: each host's 4 ranks send their buffer to the other host's 4.
  EXPECT_NEAR(Predict(RingShape{8, {4, 4}}, OpKind::kAllReduce,
                      Algorithm::kNaive, s, m),
              1e-4 + 16 * s / 1e9, kTol);
  // 2 x 4 recursive doubling: log2 4 = 2 rounds inside the host, 1 round
  // of 4 buffers through the NIC.
  EXPECT_NEAR(Predict(RingShape{8, {4, 4}}, OpKind::kAllReduce,
                      Algorithm::kRecursiveDoubling, s, m),
              2 * (1e-6 + s / 1e10) + (1e-4 + 4 * s / 1e9), kTol);
  // 2 x 3 (g not a power of two): every round and the fold at the NIC.
  EXPECT_NEAR(Predict(RingShape{6, {3, 3}}, OpKind::kAllReduce,
                      Algorithm::kRecursiveDoubling, s, m),
              4 * (1e-4 + 3 * s / 1e9), kTol);
}

// Halving-doubling: round k moves S / 2^(k+1) each way; ranks beyond the
// power of two add a whole buffer in and out; on hosts of a power of two
// the first log2 g rounds stay inside, the later ones share the host's NIC.
TEST(CostModel, HalvingDoublingHalvesThenDoubles) {
  const LinkModel m = OneLevel(10e-6, 1e9);
  const double s = 8e6;
  const Algorithm hd = Algorithm::kHalvingDoubling;
  auto msg = [&](double bytes) { return 10e-6 + bytes / 1e9; };
  EXPECT_NEAR(Predict(RingShape{8, {8}}, OpKind::kAllReduce, hd, s, m),
              2 * (msg(4e6) + msg(2e6) + msg(1e6)), kTol);
  // G = 6: p = 4, and the fold in and out.
  EXPECT_NEAR(Predict(RingShape{6, {6}}, OpKind::kAllReduce, hd, s, m),
              2 * (msg(4e6) + msg(2e6)) + 2 * msg(s), kTol);
  // G = 2: the ring's two half-size steps (auto's ties go to the ring).
  EXPECT_NEAR(Predict(RingShape{2, {2}}, OpKind::kAllReduce, hd, s, m),
              Predict(RingShape{2, {2}}, OpKind::kAllReduce, Algorithm::kRing,
                      s, m),
              kTol);
  // Two hosts of four: rounds 0 and 1 inside, round 2 across with the
  // host's four ranks on its NIC.
  const LinkModel two = TwoLevels();
  EXPECT_NEAR(Predict(RingShape{8, {4, 4}}, OpKind::kAllReduce, hd, s, two),
              2 * (two.local.Message(4e6) + two.local.Message(2e6)) +
                  2 * (1e-4 + 4 * 1e6 / 1e9),
              kTol);
  // Where alpha counts, it beats the ring's 14 steps; where the buffer is
  // small, recursive doubling's 3 whole-buffer swaps beat both.
  const LinkModel slow = OneLevel(50e-6, 1e9);
  EXPECT_EQ(BestByModel(RingShape{8, {}}, OpKind::kAllReduce, 1 << 20, slow)
                ->algorithm,
            hd);
  EXPECT_NE(BestByModel(RingShape{8, {}}, OpKind::kAllReduce, 4096, slow)
                ->algorithm,
            hd);
  // Not a candidate where the fingerprints do not go to every rank, where
  // two-level runs, or above halving_max_bytes.
  for (Algorithm a : AutoCandidates(RingShape{8, {4, 4}}, OpKind::kAllReduce,
                                    1 << 20)) {
    EXPECT_NE(a, hd);
  }
  for (Algorithm a : AutoCandidates(RingShape{8, {}}, OpKind::kAllReduce,
                                    8 << 20)) {
    EXPECT_NE(a, hd);
  }
  for (int g : {2, 3, 6, 12}) {
    for (Algorithm a : AutoCandidates(RingShape{g, {}}, OpKind::kAllReduce,
                                      1 << 20)) {
      EXPECT_NE(a, hd) << "G " << g;
    }
  }
  for (Algorithm a : AutoCandidates(RingShape{32, {}}, OpKind::kAllReduce,
                                    1 << 20)) {
    EXPECT_NE(a, hd);
  }
  for (Algorithm a : AutoCandidates(RingShape{8, {}}, OpKind::kAllGather,
                                    1 << 20)) {
    EXPECT_NE(a, hd);
  }
}

TEST(CostModel, TwoLevelAllReduceAndItsSlices) {
  const LinkModel m = TwoLevels();
  const double s = 4e6;
  // 2 x 2: 2(g-1) steps of S/g inside, 2(H-1) steps of S/H across.
  EXPECT_NEAR(Predict(RingShape{4, {2, 2}}, OpKind::kAllReduce,
                      Algorithm::kTwoLevel, s, m),
              2 * (1e-6 + 2e6 / 1e10) + 2 * (1e-4 + 2e6 / 1e9), kTol);
  // 2 x 4 reduce-scatter and all-gather: g-1 steps of a column (S/g)
  // inside, H-1 steps of S/H across.
  for (OpKind kind : {OpKind::kReduceScatter, OpKind::kAllGather}) {
    EXPECT_NEAR(Predict(RingShape{8, {4, 4}}, kind, Algorithm::kTwoLevel, s, m),
                3 * (1e-6 + 1e6 / 1e10) + 1 * (1e-4 + 2e6 / 1e9), kTol);
    // The ring in host order: 7 steps, each bound by the NIC's S/G.
    EXPECT_NEAR(Predict(RingShape{8, {4, 4}}, kind, Algorithm::kRing, s, m),
                7 * (0.5e6 / 1e9), kTol);
  }
  // Where two-level cannot run it runs, and is predicted as, the ring.
  const RingShape uneven{4, {3, 1}};
  EXPECT_EQ(Predict(uneven, OpKind::kAllReduce, Algorithm::kTwoLevel, s, m),
            Predict(uneven, OpKind::kAllReduce, Algorithm::kRing, s, m));
  EXPECT_FALSE(uneven.two_level_usable());
  EXPECT_TRUE((RingShape{6, {3, 3}}).two_level_usable());
  // The tree on hosts: 2 hops to and from the leader inside, 2 ceil(log2 H)
  // across (the first 1 MiB chunk stored and forwarded once on the way),
  // H = 2: one edge in each tree, half the buffer each: S each way.
  EXPECT_NEAR(Predict(RingShape{4, {2, 2}}, OpKind::kAllReduce,
                      Algorithm::kTree, s, m),
              2 * 1e-4 + (1 << 20) / 1e9 + 4e6 / 1e9 + 2 * 1e-6 + 4e6 / 1e10,
              kTol);
}

TEST(CostModel, WhatItCannotPredictIsSaid) {
  const LinkModel m = TwoLevels();
  const RingShape hosts{4, {2, 2}};
  EXPECT_FALSE(PredictSeconds(hosts, OpKind::kAllReduce,
                              Algorithm::kParameterServer, 1e6, m));
  EXPECT_FALSE(PredictSeconds(hosts, OpKind::kGather, Algorithm::kNaive, 1e6, m));
  EXPECT_FALSE(
      PredictSeconds(hosts, OpKind::kReduceScatter, Algorithm::kTree, 1e6, m));
  // Two-level needs both levels.
  LinkModel net_only;
  net_only.net = m.net;
  EXPECT_FALSE(PredictSeconds(hosts, OpKind::kAllReduce, Algorithm::kTwoLevel,
                              1e6, net_only));
  EXPECT_FALSE(PredictSeconds(hosts, OpKind::kAllReduce, Algorithm::kRing, 1e6,
                              LinkModel{}));
  EXPECT_FALSE(BestByModel(hosts, OpKind::kAllReduce, 1e6, LinkModel{}));
  // Only what auto may run: recursive doubling up to 16 MiB, naive and
  // recursive doubling up to 16 ranks. At G = 2 one swap (or naive's one
  // hop, the same cost) beats the ring's two steps at any size, but above
  // 16 MiB recursive doubling is not a candidate.
  const LinkModel one = OneLevel(1e-5, 1e9);
  EXPECT_NE(BestByModel(RingShape{2, {2}}, OpKind::kAllReduce, 1e6, one)
                ->algorithm,
            Algorithm::kRing);
  EXPECT_NE(BestByModel(RingShape{2, {2}}, OpKind::kAllReduce, 64e6, one)
                ->algorithm,
            Algorithm::kRecursiveDoubling);
  for (Algorithm a : AutoCandidates(RingShape{2, {2}}, OpKind::kAllReduce, 64e6)) {
    EXPECT_NE(a, Algorithm::kRecursiveDoubling);
  }
  for (Algorithm a : AutoCandidates(RingShape{32, {}}, OpKind::kAllReduce, 8)) {
    EXPECT_NE(a, Algorithm::kNaive);
    EXPECT_NE(a, Algorithm::kRecursiveDoubling);
  }
  EXPECT_EQ(AutoCandidates(RingShape{4, {2, 2}}, OpKind::kBroadcast, 8),
            (std::vector<Algorithm>{Algorithm::kRing, Algorithm::kTree}));
  EXPECT_EQ(AutoCandidates(RingShape{2, {2}}, OpKind::kBroadcast, 8),
            std::vector<Algorithm>{Algorithm::kRing});
  EXPECT_EQ(DescribeLevel(LevelCost{}), "not known");
  EXPECT_EQ(DescribeLevel(m.net), "alpha 100.0 us, B 1.000 GB/s");
}

TEST(CostModel, TheChoiceFollowsSizeAndLatency) {
  const LinkModel m = TwoLevels();
  const RingShape hosts{8, {4, 4}};
  // Large buffers on hosts: two-level (the least through the NIC).
  auto big = BestByModel(hosts, OpKind::kAllReduce, 64e6, m);
  ASSERT_TRUE(big.has_value());
  EXPECT_EQ(big->algorithm, Algorithm::kTwoLevel);
  EXPECT_NEAR(big->seconds,
              *PredictSeconds(hosts, OpKind::kAllReduce, Algorithm::kTwoLevel,
                              64e6, m),
              kTol);
  // Small ones: the fewest network hops: recursive doubling's one round
  // across (its first two stay inside the host, and its frames carry the
  // fingerprints), against naive's fingerprint pass and hop, and the
  // tree's and two-level's pass and 2.
  auto small = BestByModel(hosts, OpKind::kAllReduce, 64, m);
  ASSERT_TRUE(small.has_value());
  EXPECT_EQ(small->algorithm, Algorithm::kRecursiveDoubling);
  // With cheap hops and a mid-size buffer, two-level's S/H across beats
  // naive's (G-1) S through one link.
  EXPECT_EQ(BestByModel(hosts, OpKind::kAllReduce, 1e6, m)->algorithm,
            Algorithm::kTwoLevel);
  // One host, cheap latency, large buffer: the ring; tiny buffer: a
  // one-hop or log2 G algorithm, never the ring's 2(G-1) steps.
  const RingShape one{8, {8}};
  EXPECT_EQ(BestByModel(one, OpKind::kAllReduce, 64e6, OneLevel(1e-6, 1e9))
                ->algorithm,
            Algorithm::kRing);
  const Algorithm tiny =
      BestByModel(one, OpKind::kAllReduce, 8, OneLevel(50e-6, 1e9))->algorithm;
  EXPECT_NE(tiny, Algorithm::kRing);
  EXPECT_EQ(tiny, Algorithm::kNaive);  // one hop of 8 bytes
  // Slices on hosts: two-level; without hosts: the ring.
  EXPECT_EQ(BestByModel(hosts, OpKind::kReduceScatter, 1e6, m)->algorithm,
            Algorithm::kTwoLevel);
  EXPECT_EQ(BestByModel(RingShape{8, {}}, OpKind::kAllGather, 1e6, m)->algorithm,
            Algorithm::kRing);
}

TEST(CostModel, SameLinkModelReadsBackWhatAMembershipCarries) {
  const LinkModel m = *ParseLinkModel("local=3:7.5,net=47:1.1");
  // As the rendezvous writes it (microseconds) and a worker reads it back.
  LinkModel back = m;
  back.local.alpha_s = (m.local.alpha_s * 1e6) * 1e-6;
  back.net.alpha_s = (m.net.alpha_s * 1e6) * 1e-6;
  EXPECT_TRUE(SameLinkModel(m, back));
  EXPECT_TRUE(SameLinkModel(std::nullopt, std::nullopt));
  EXPECT_FALSE(SameLinkModel(m, std::nullopt));
  EXPECT_FALSE(SameLinkModel(std::nullopt, m));
  // Within a part in 10^9, not beyond.
  LinkModel near = m;
  near.net.alpha_s *= 1 + 1e-12;
  near.local.bytes_per_s *= 1 - 1e-12;
  EXPECT_TRUE(SameLinkModel(m, near));
  LinkModel other = m;
  other.net.bytes_per_s *= 1 + 1e-8;
  EXPECT_FALSE(SameLinkModel(m, other));
}

TEST(CostModel, ItsTextFormAndWhatIsRefused) {
  absl::StatusOr<LinkModel> m = ParseLinkModel("local=5:8,net=60:1.25");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_NEAR(m->local.alpha_s, 5e-6, kTol);
  EXPECT_NEAR(m->local.bytes_per_s, 8e9, 1e-3);
  EXPECT_NEAR(m->net.alpha_s, 60e-6, kTol);
  EXPECT_NEAR(m->net.bytes_per_s, 1.25e9, 1e-3);
  EXPECT_EQ(DescribeLinkModel(*m),
            "local: alpha 5.0 us, B 8.000 GB/s; net: alpha 60.0 us, B 1.250 GB/s");
  absl::StatusOr<LinkModel> net = ParseLinkModel("net=0:1");
  ASSERT_TRUE(net.ok()) << net.status();
  EXPECT_FALSE(net->local.known());
  EXPECT_TRUE(net->net.known());
  for (const char* bad : {"", ",", "wan=1:1", "local=1", "local=:1",
                          "local=-1:1", "local=1:0", "local=1:-2", "net=x:1",
                          "net=1:inf", "local=1:1,net", "net=1:1e300"}) {
    absl::StatusOr<LinkModel> r = ParseLinkModel(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("link model"), std::string::npos)
        << r.status();
  }
}

// A 2 x 2 job's config, with or without a link model.
CommConfig HostsOfTwo(std::optional<LinkModel> model) {
  CommConfig c;
  c.world_size = 4;
  c.hosts = {{0, 1}, {2, 3}};
  c.link_model = model;
  return c;
}

Fingerprint Call(OpKind kind, uint64_t count,
                 Algorithm algorithm = Algorithm::kAuto) {
  Fingerprint fp;
  fp.kind = kind;
  fp.dtype = DType::kFloat32;
  fp.count = count;
  fp.algorithm = algorithm;
  return fp;
}

TEST(CostModel, AutoRanksByTheJobsModelWhereItHasOne) {
  const CommConfig counting = HostsOfTwo(std::nullopt);
  const CommConfig model = HostsOfTwo(TwoLevels());
  // 64 bytes: the counting rules run recursive doubling, and so does the
  // model (one round inside, one across carrying the fingerprints, where
  // naive pays the fingerprint pass and its hop across).
  EXPECT_EQ(ResolveAlgorithm(counting, Call(OpKind::kAllReduce, 16)),
            Algorithm::kRecursiveDoubling);
  EXPECT_EQ(ResolveAlgorithm(model, Call(OpKind::kAllReduce, 16)),
            Algorithm::kRecursiveDoubling);
  // 4 MB: both two-level.
  EXPECT_EQ(ResolveAlgorithm(model, Call(OpKind::kAllReduce, 1 << 20)),
            Algorithm::kTwoLevel);
  // Links inside the host slow, between hosts fast: the ring in host
  // order crosses them too (half its edges on 2 x 2), and moves more over
  // them than two-level does (its 3 steps each way of S/4 against
  // two-level's one of S/2): the model keeps two-level for a
  // reduce-scatter, as the rules do.
  const CommConfig slow_local = HostsOfTwo(LinkModel{
      LevelCost{1e-3, 1e7}, LevelCost{1e-6, 1e11}});
  EXPECT_EQ(ResolveAlgorithm(counting, Call(OpKind::kAllReduce, 1 << 20)),
            Algorithm::kTwoLevel);
  EXPECT_EQ(ResolveAlgorithm(counting, Call(OpKind::kReduceScatter, 4000)),
            Algorithm::kTwoLevel);
  EXPECT_EQ(ResolveAlgorithm(slow_local, Call(OpKind::kReduceScatter, 4000)),
            Algorithm::kTwoLevel);
  EXPECT_LT(*PredictSeconds(RingShape{4, {2, 2}}, OpKind::kReduceScatter,
                            Algorithm::kTwoLevel, 16000, *slow_local.link_model),
            *PredictSeconds(RingShape{4, {2, 2}}, OpKind::kReduceScatter,
                            Algorithm::kRing, 16000, *slow_local.link_model));
  // Between hosts 2 ms away, a 1 MiB all-reduce on 4 x 2: the tree's one
  // chunk is stored and forwarded at each of its 4 hops (4 x 13 ms), where
  // the ring's pipelined steps are bound by the NIC: the ring, not the
  // tree (as measured on the delayed test bed, docs/scaling.md).
  CommConfig far = HostsOfTwo(LinkModel{LevelCost{23e-6, 0.86e9},
                                        LevelCost{3.2e-3, 0.105e9}});
  far.world_size = 8;
  far.hosts = {{0, 1}, {2, 3}, {4, 5}, {6, 7}};
  const Algorithm mid = ResolveAlgorithm(far, Call(OpKind::kAllReduce, 1 << 18));
  EXPECT_NE(mid, Algorithm::kTree);
  EXPECT_EQ(ResolveAlgorithm(far, Call(OpKind::kAllReduce, 1 << 20)),
            Algorithm::kRing);
  // 4 KiB: recursive doubling's two rounds across (its fingerprints on
  // them) against naive's pass and hop and its 12 copies through the NIC.
  EXPECT_EQ(ResolveAlgorithm(far, Call(OpKind::kAllReduce, 1024)),
            Algorithm::kRecursiveDoubling);
  EXPECT_EQ(ResolveAlgorithm(model, Call(OpKind::kAllGather, 4000)),
            Algorithm::kTwoLevel);
  // Whatever it ranks first is what BestByModel says among what may run.
  for (uint64_t count : {uint64_t{1}, uint64_t{1} << 10, uint64_t{1} << 16,
                         uint64_t{1} << 22}) {
    const auto best = BestByModel(RingShape{4, {2, 2}}, OpKind::kAllReduce,
                                  static_cast<double>(count * 4), TwoLevels());
    ASSERT_TRUE(best.has_value());
    EXPECT_EQ(ResolveAlgorithm(model, Call(OpKind::kAllReduce, count)),
              best->algorithm)
        << count;
  }
  // Recursive doubling and naive only where every rank may talk to every
  // rank: above all_to_all_max_world, the tree at 64 bytes.
  CommConfig wide = HostsOfTwo(TwoLevels());
  wide.all_to_all_max_world = 2;
  const Algorithm small = ResolveAlgorithm(wide, Call(OpKind::kAllReduce, 16));
  EXPECT_NE(small, Algorithm::kNaive);
  EXPECT_NE(small, Algorithm::kRecursiveDoubling);
  // Asked-for algorithms are not the model's business.
  EXPECT_EQ(ResolveAlgorithm(model,
                             Call(OpKind::kAllReduce, 16, Algorithm::kRing)),
            Algorithm::kRing);
  EXPECT_EQ(ResolveAlgorithm(slow_local, Call(OpKind::kReduceScatter, 4000,
                                              Algorithm::kTwoLevel)),
            Algorithm::kTwoLevel);
  // What it predicted for what ran (0 without a model).
  EXPECT_DOUBLE_EQ(
      ModelSeconds(model, Call(OpKind::kAllReduce, 16), Algorithm::kNaive),
      *PredictSeconds(RingShape{4, {2, 2}}, OpKind::kAllReduce,
                      Algorithm::kNaive, 64, TwoLevels()));
  EXPECT_EQ(ModelSeconds(counting, Call(OpKind::kAllReduce, 16),
                         Algorithm::kRecursiveDoubling),
            0);
  EXPECT_EQ(ModelSeconds(model, Call(OpKind::kAllReduce, 16),
                         Algorithm::kParameterServer),
            0);
  // A model of one level on hosts cannot price two-level or the tree: the
  // counting rules (two-level at 4 MB), not a ranking without them.
  EXPECT_EQ(ResolveAlgorithm(HostsOfTwo(LinkModel{LevelCost{}, TwoLevels().net}),
                             Call(OpKind::kAllReduce, 1 << 20)),
            Algorithm::kTwoLevel);
  EXPECT_EQ(ResolveAlgorithm(HostsOfTwo(LinkModel{TwoLevels().local, LevelCost{}}),
                             Call(OpKind::kReduceScatter, 4000)),
            Algorithm::kTwoLevel);
  // Two ranks: recursive doubling's one swap ties naive's one hop and goes
  // first; naive only up to eager_bytes; above 16 MiB the ring.
  CommConfig two;
  two.world_size = 2;
  two.link_model = OneLevel(1e-5, 1e9);
  EXPECT_EQ(ResolveAlgorithm(two, Call(OpKind::kAllReduce, 16)),
            Algorithm::kRecursiveDoubling);
  EXPECT_EQ(ResolveAlgorithm(two, Call(OpKind::kAllReduce, 1 << 20)),
            Algorithm::kRecursiveDoubling);
  EXPECT_EQ(ResolveAlgorithm(two, Call(OpKind::kAllReduce, 16 << 20)),
            Algorithm::kRing);
  // A model that cannot predict (no level known): the counting rules.
  EXPECT_EQ(ResolveAlgorithm(HostsOfTwo(LinkModel{}),
                             Call(OpKind::kAllReduce, 16)),
            Algorithm::kRecursiveDoubling);
}

// The chain broadcast pipelines by 1 MiB chunks: one chunk is G-1 hops
// of the whole buffer, k chunks G-1 + k-1 hops of a chunk. The tree takes
// ceil(log2 H) steps of the buffer across hosts and ceil(log2 g) inside,
// so it wins below a chunk and the chain far above.
TEST(CostModel, BroadcastChainAgainstTree) {
  LinkModel m;
  m.local = LevelCost{10e-6, 4e9};
  m.net = LevelCost{50e-6, 1.25e9};
  const RingShape hosts{8, {2, 2, 2, 2}};
  const double s = 4096;
  // Each after its fingerprint pass, one net hop.
  const double pass = m.net.alpha_s;
  EXPECT_NEAR(*PredictSeconds(hosts, OpKind::kBroadcast, Algorithm::kRing, s, m),
              pass + 7 * m.net.Message(s), 1e-12);
  EXPECT_NEAR(*PredictSeconds(hosts, OpKind::kBroadcast, Algorithm::kTree, s, m),
              pass + 2 * m.net.Message(s) + 1 * m.local.Message(s), 1e-12);
  const double big = 64.0 * (1 << 20);
  EXPECT_NEAR(
      *PredictSeconds(hosts, OpKind::kBroadcast, Algorithm::kRing, big, m),
      pass + (7 + 63) * m.net.Message(big / 64), 1e-9);
  EXPECT_EQ(BestByModel(hosts, OpKind::kBroadcast, s, m)->algorithm,
            Algorithm::kTree);
  EXPECT_EQ(BestByModel(hosts, OpKind::kBroadcast, big, m)->algorithm,
            Algorithm::kRing);
  // One host: the tree's ceil(log2 G) steps at the local level.
  const RingShape one{8, {8}};
  EXPECT_NEAR(*PredictSeconds(one, OpKind::kBroadcast, Algorithm::kTree, s, m),
              m.local.alpha_s + 3 * m.local.Message(s), 1e-12);
}

}  // namespace
}  // namespace halka
