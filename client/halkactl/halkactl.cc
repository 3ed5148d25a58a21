// halkactl: the command line for halka.
//
//   halkactl demo      [--workers=4]            embedded cluster, table, health
//   halkactl bench     [-b 8 -e 64M -f 4 -n 5 -w 1 -c 1] [--workers=G |
//                      --worker=ADDR,ADDR,...] [--dtype] [--op] [--json]
//                      [--coll=allreduce|allgather|reducescatter|broadcast]
//   halkactl allreduce --worker=ADDR [--count] [--dtype] [--op] [--check]
//                      [--coll=allreduce|reducescatter|allgather]
//   halkactl health    --rendezvous=ADDR --job=ID   (or --worker=ADDR)
//                      [--json] [--watch [--interval=2s] [--watch_count=N]]
//   halkactl healthcheck --worker=ADDR   grpc.health.v1 status (for probes)
//   halkactl trace     --rendezvous=ADDR --job=ID -o FILE   every rank's
//                      timeline as one Chrome trace (JSON)
#include <unistd.h>

#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/client_proto.h"
#include "client/halkactl/allreduce_cmd.h"
#include "client/halkactl/bench.h"
#include "client/halkactl/health_cmd.h"
#include "common/grpc_util.h"
#include "common/security.h"
#include "halka/client.h"
#include "halka/local_cluster.h"
#include "core/cuda/cuda_reduce.h"
#include "core/dtype.h"
#include "core/frame.h"
#include "core/testing/reference.h"
#include "seal/wire_seal.h"

ABSL_FLAG(int, workers, 4, "embedded cluster size (demo, bench)");
ABSL_FLAG(bool, model, false,
          "bench: probe the links (sendrecv around the ring, 8 B and 4 MiB) "
          "and print the latency-bandwidth model's prediction for the "
          "algorithm that ran next to the measured time, and the algorithm "
          "the model would pick (docs/scaling.md)");
ABSL_FLAG(int, hosts, 0,
          "bench: the embedded workers name this many hosts, rank r host "
          "'h<r mod H>' (--host_id), so that the ring runs in host order and "
          "two_level can run; the links between them are what --shm_links "
          "says, all on this machine. 0: one host");
ABSL_FLAG(std::string, worker, "",
          "worker address(es); bench takes one per rank, comma-separated");
ABSL_FLAG(std::string, rendezvous, "", "rendezvous host:port (health)");
ABSL_FLAG(std::string, job, "default", "job id (health)");
ABSL_FLAG(std::string, b, "8", "bench: smallest size in bytes (K/M/G)");
ABSL_FLAG(std::string, e, "64M", "bench: largest size in bytes (K/M/G)");
ABSL_FLAG(int, f, 4, "bench: size multiplication factor");
ABSL_FLAG(int, n, 5, "bench: timed iterations per size");
ABSL_FLAG(int, w, 1, "bench: warm-up iterations per size");
ABSL_FLAG(int, c, 1, "bench: check results against the reference (0/1)");
ABSL_FLAG(std::string, dtype, "float32", "element type");
ABSL_FLAG(std::string, op, "sum", "reduction: sum, avg, min, max, prod");
ABSL_FLAG(bool, json, false, "bench: one JSON object per row instead of a "
          "table; health: the RingHealth reply as protobuf JSON");
ABSL_FLAG(std::string, o, "", "trace: the Chrome trace JSON file to write "
          "(\"-\": standard output)");
ABSL_FLAG(std::string, trace, "",
          "bench: write every rank's timeline of the last operations (up to "
          "64 per rank) to this file as Chrome trace JSON");
ABSL_FLAG(bool, watch, false, "health: print again every --interval");
ABSL_FLAG(absl::Duration, interval, absl::Seconds(2),
          "health --watch: time between refreshes");

ABSL_FLAG(int64_t, watch_count, 0, "health --watch: reports to print "
          "(0: until interrupted)");

ABSL_FLAG(int64_t, count, 1 << 20, "allreduce: elements per rank");
ABSL_FLAG(bool, check, true, "allreduce: verify the result (every rank runs "
          "halkactl allreduce with the same flags; an all-reduce's expected "
          "result is made once, before the first operation: 12 bytes per "
          "element for floats, the element's size for integers; a "
          "reduce-scatter or all-gather holds every rank's input)");
ABSL_FLAG(absl::Duration, timeout, halka::kDefaultOpTimeout,
          "operation deadline");
ABSL_FLAG(int64_t, chunk_bytes, 1 << 20, "embedded cluster: bytes per frame");
ABSL_FLAG(bool, shm_links, true,
          "embedded cluster: peer links through shared memory (the workers "
          "share this host); false: over loopback TCP (see --wire_links)");
ABSL_FLAG(int64_t, shm_spin_us, -1,
          "embedded cluster: microseconds a reader of a same-host ring "
          "(links, an operation waiting on its rings, sessions) polls it "
          "before it sleeps (0-1000; 0: sleeps at once; -1, auto: an "
          "operation polls 50 us where this host's ranks have a CPU each, "
          "and elsewhere yields its core between looks for 100 us)");
ABSL_FLAG(bool, wire_links, true,
          "embedded cluster: links that are not through shared memory take "
          "a TCP connection of their own; false: the gRPC stream");
ABSL_FLAG(bool, wire_tap, true,
          "embedded cluster: an operation's thread reads its wire links' "
          "small frames itself while it waits; false: each link's reader "
          "thread hands every frame over (to compare)");
ABSL_FLAG(std::string, wire_congestion, "system",
          "embedded cluster: TCP congestion control of the wire links' "
          "sending sockets: system (the host's), auto (the host's, except "
          "bbr on a link whose round trip is under 1 ms: cubic, or reno "
          "where cubic is not allowed), or a name");
ABSL_FLAG(bool, wire_landing, true,
          "embedded cluster: wire links' readers write all-gather and "
          "broadcast chunks straight into the operation's buffer; false: "
          "every chunk is copied there (to compare)");
ABSL_FLAG(bool, session, true,
          "bench/allreduce: operations reach a worker on this host through "
          "a shared-memory session (false: one gRPC call each)");
ABSL_FLAG(bool, in_process, true,
          "demo/bench: the clients run their calls on the embedded workers "
          "directly, on their own threads (false: through a session or a "
          "gRPC call, as to a worker in another process)");
ABSL_FLAG(int, repeat, 1, "allreduce: operations to run back to back");
ABSL_FLAG(std::string, algo, "auto",
          "all-reduce algorithm: auto, ring, naive, ps, two_level, tree, "
          "recursive_doubling, halving_doubling (--coll=broadcast: auto, "
          "ring (the chain) or tree; bench: also all = "
          "ring,tree,ps,naive, or a "
          "comma-separated list)");
ABSL_FLAG(std::string, coll, "allreduce",
          "bench: the collective: allreduce, allgather, reducescatter, "
          "broadcast, reduce, gather, scatter (rooted at rank 0), alltoall "
          "or sendrecv (each rank to the next, from the previous); sizes "
          "are the whole buffer, as in nccl-tests. allreduce: allreduce, "
          "reducescatter (--count is the whole input, world x slice) or "
          "allgather (--count is each rank's contribution)");
ABSL_FLAG(int, ps_shards, 1, "bench: parameter-server shards of the embedded "
          "cluster (with --algo=ps or all)");
ABSL_FLAG(bool, device, false,
          "bench/allreduce: CUDA device buffers (needs a GPU and a worker on "
          "this host)");
ABSL_FLAG(std::string, transfer, "auto",
          "allreduce/bench: how the tensor reaches the worker: auto, shm, "
          "inline");
ABSL_FLAG(bool, tls, false,
          "bench embedded cluster: mutual TLS and a job token on every "
          "channel (throwaway certificates made with openssl in a temp dir, "
          "or those in --tls_dir)");
ABSL_FLAG(std::string, tls_dir, "",
          "bench --tls: use DIR/ca.pem and DIR/localhost.pem, "
          "DIR/localhost.key (scripts/certs.sh DIR) instead of making "
          "certificates with openssl (for hosts without the openssl tool)");

namespace halka {
namespace {

// Removes a directory (and what it holds) when it goes out of scope.
struct RemovedAtExit {
  std::string dir;
  ~RemovedAtExit() {
    std::error_code ec;
    if (!dir.empty()) std::filesystem::remove_all(dir, ec);
  }
};

std::string BenchJobToken() {
  return absl::StrCat("bench-", getpid(), "-", absl::ToUnixNanos(absl::Now()));
}

// A throwaway CA and a localhost certificate signed by it (openssl), for
// the embedded cluster's mutual TLS: the certificate is both server and
// client certificate. `dir` gets the directory that holds them (and the
// keys), for the caller to remove once the cluster is gone.
absl::Status MakeThrowawayCertificates(LocalCluster::Options& lo,
                                       RemovedAtExit& dir) {
  char tmpl[] = "/tmp/halka-tls-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return absl::InternalError("mkdtemp failed");
  const std::string d = tmpl;
  dir.dir = d;
  const std::string cmd = absl::StrCat(
      "set -e; cd ", d, "; ",
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
      "-nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=halka-bench-ca "
      "-addext basicConstraints=critical,CA:TRUE "
      "-addext keyUsage=critical,keyCertSign; ",
      "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
      "-keyout host.key -out host.csr -subj /CN=localhost; ",
      "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n"
      "extendedKeyUsage=serverAuth,clientAuth\n' > ext; ",
      "openssl x509 -req -in host.csr -CA ca.pem -CAkey ca.key "
      "-CAcreateserial -out host.pem -days 2 -extfile ext",
      " >/dev/null 2>&1");
  if (std::system(cmd.c_str()) != 0) {
    return absl::FailedPreconditionError(
        "--tls: openssl could not make certificates (is it installed?)");
  }
  lo.tls_ca = d + "/ca.pem";
  lo.tls_cert = d + "/host.pem";
  lo.tls_key = d + "/host.key";
  lo.job_token = BenchJobToken();
  return absl::OkStatus();
}

// Certificates made beforehand (scripts/certs.sh DIR): the CA and the
// localhost certificate, which serves as server and client certificate.
absl::Status UseCertificates(const std::string& dir, LocalCluster::Options& lo) {
  for (const char* name : {"ca.pem", "localhost.pem", "localhost.key"}) {
    const std::string path = dir + "/" + name;
    if (access(path.c_str(), R_OK) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tls_dir: cannot read ", path,
          " (make the directory with scripts/certs.sh DIR)"));
    }
  }
  lo.tls_ca = dir + "/ca.pem";
  lo.tls_cert = dir + "/localhost.pem";
  lo.tls_key = dir + "/localhost.key";
  lo.job_token = BenchJobToken();
  return absl::OkStatus();
}

int Bench(const std::vector<Client*>& clients, const std::vector<BenchCase>& cases,
          const BenchOptions& options, bool json) {
  const int g = static_cast<int>(clients.size());
  std::optional<BenchModel> model;
  if (absl::GetFlag(FLAGS_model)) {
    absl::StatusOr<BenchModel> m = ProbeBenchModel(clients, options);
    if (!m.ok()) return Fail(m.status());
    model = std::move(*m);
    if (!json) std::printf("# %s\n", model->how.c_str());
  }
  if (!json && !cases.empty()) {
    const OpKind kind = cases[0].kind;
    const char* factor =
        kind == OpKind::kAllReduce                               ? "2(G-1)/G"
        : kind == OpKind::kBroadcast || kind == OpKind::kSend ? "1"
                                                                : "(G-1)/G";
    std::printf("# halka %s: %d ranks, %d iterations (+%d warm-up), "
                "busbw = algbw * %s\n",
                CollectiveName(kind).c_str(), g,
                options.iterations,
                options.warmup, factor);
    std::printf("%s\n", BenchHeader(model.has_value()).c_str());
  }
  int bad = 0;
  for (const BenchCase& c : cases) {
    const bool live = !json && isatty(2);
    if (live) {
      std::fprintf(stderr, "  running %zu bytes %s %s ...\r", c.bytes,
                   std::string(DTypeName(c.dtype)).c_str(),
                   std::string(ReduceOpName(c.op)).c_str());
    }
    BenchRow row = RunBenchCase(clients, c, options);
    if (model.has_value() && row.error.empty()) ApplyModel(*model, g, row);
    if (!row.error.empty() || row.wrong > 0) ++bad;
    if (json) {
      std::printf("%s\n", BenchRowJson(row, g).c_str());
    } else {
      if (live) std::fprintf(stderr, "%60s\r", "");
      std::printf("%s\n", FormatBenchRow(row, model.has_value()).c_str());
    }
    std::fflush(stdout);
  }
  return bad == 0 ? 0 : 1;
}

absl::StatusOr<std::vector<BenchCase>> SweepCases() {
  auto lo = ParseBytes(absl::GetFlag(FLAGS_b));
  if (!lo.ok()) return lo.status();
  auto hi = ParseBytes(absl::GetFlag(FLAGS_e));
  if (!hi.ok()) return hi.status();
  auto dtype = ParseDType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok()) return dtype.status();
  auto op = ParseReduceOp(absl::GetFlag(FLAGS_op));
  if (!op.ok()) return op.status();
  const int f = absl::GetFlag(FLAGS_f);
  if (f < 2) return absl::InvalidArgumentError("-f must be at least 2");
  if (*lo > *hi) return absl::InvalidArgumentError("-b is larger than -e");
  auto kind = ParseCollective(absl::GetFlag(FLAGS_coll));
  if (!kind.ok()) return kind.status();
  std::vector<Algorithm> algos;
  const std::string algo = absl::GetFlag(FLAGS_algo);
  if (algo == "all" && *kind == OpKind::kBroadcast) {
    algos = {Algorithm::kRing, Algorithm::kTree};  // all a broadcast runs
  } else if (algo == "all") {
    algos = {Algorithm::kRing, Algorithm::kTree, Algorithm::kParameterServer,
             Algorithm::kNaive};
  } else {
    // One algorithm or a comma-separated list, in the order given.
    for (absl::string_view name :
         absl::StrSplit(algo, ',', absl::SkipWhitespace())) {
      auto a = ParseAlgorithm(std::string(absl::StripAsciiWhitespace(name)));
      if (!a.ok()) return a.status();
      algos.push_back(*a);
    }
  }
  std::vector<BenchCase> cases;
  for (size_t s = std::max<size_t>(*lo, 1); s <= *hi; s *= static_cast<size_t>(f)) {
    for (Algorithm a : algos) {
      cases.push_back(BenchCase{s, *dtype, *op, a, *kind});
    }
  }
  return cases;
}

// --transfer and --session.
absl::StatusOr<Client::Options> ClientOptionsFromFlags() {
  Client::Options co;
  co.session = absl::GetFlag(FLAGS_session);
  co.in_process = absl::GetFlag(FLAGS_in_process);
  const std::string transfer = absl::GetFlag(FLAGS_transfer);
  if (transfer == "shm") {
    co.transfer = Client::Transfer::kSharedMemory;
  } else if (transfer == "inline") {
    co.transfer = Client::Transfer::kInline;
  } else if (transfer != "auto") {
    return absl::InvalidArgumentError("--transfer must be auto, shm or inline");
  }
  return co;
}

BenchOptions OptionsFromFlags() {
  BenchOptions o;
  o.iterations = absl::GetFlag(FLAGS_n);
  o.warmup = absl::GetFlag(FLAGS_w);
  o.check = absl::GetFlag(FLAGS_c) != 0;
  o.timeout = absl::GetFlag(FLAGS_timeout);
  o.device = absl::GetFlag(FLAGS_device);
  return o;
}

int Demo() {
  LocalCluster::Options lo;
  lo.workers = absl::GetFlag(FLAGS_workers);
  lo.chunk_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_chunk_bytes));
  lo.shm_links = absl::GetFlag(FLAGS_shm_links);
  lo.wire_links = absl::GetFlag(FLAGS_wire_links);
  lo.wire_landing = absl::GetFlag(FLAGS_wire_landing);
  lo.wire_tap = absl::GetFlag(FLAGS_wire_tap);
  lo.wire_congestion = absl::GetFlag(FLAGS_wire_congestion);
  // stdout is flushed before each step that logs (to stderr), so that
  // `halkactl demo 2>&1 | ...` reads in order: start, the workers' join
  // lines, the table, the ring health, the shutdown lines, the verdict.
  std::printf("# halka demo: starting an embedded cluster (rendezvous + %d "
              "workers on 127.0.0.1)\n", lo.workers);
  std::fflush(stdout);
  const absl::Time t0 = absl::Now();
  auto cluster = LocalCluster::Start(lo);
  if (!cluster.ok()) return Fail(cluster.status());
  std::printf("# ring formed in %.0f ms: ", absl::ToDoubleMilliseconds(absl::Now() - t0));
  for (int r = 0; r < (*cluster)->size(); ++r) {
    std::printf("%s%s", r ? " -> " : "", (*cluster)->worker_address(r).c_str());
  }
  std::printf(" -> back to rank 0\n");
  std::fflush(stdout);
  std::vector<std::unique_ptr<Client>> owned;
  std::vector<Client*> clients;
  for (int r = 0; r < (*cluster)->size(); ++r) {
    auto c = (*cluster)->Connect(r);
    if (!c.ok()) return Fail(c.status());
    clients.push_back(c->get());
    owned.push_back(std::move(*c));
  }
  std::vector<BenchCase> cases;
  for (size_t s = 8; s <= (size_t{64} << 20); s *= 8) {
    cases.push_back(BenchCase{s, DType::kFloat32, ReduceOp::kSum});
  }
  for (DType dt : kAllDTypes) {
    for (ReduceOp op : kAllReduceOps) {
      if (dt == DType::kFloat32 && op == ReduceOp::kSum) continue;
      if (!CheckReduction(dt, op).ok()) continue;  // avg on bool
      cases.push_back(BenchCase{size_t{1} << 20, dt, op});
    }
  }
  BenchOptions bo;
  bo.iterations = 5;
  bo.warmup = 1;
  bo.check = true;
  const int rc = Bench(clients, cases, bo, /*json=*/false);
  // One heartbeat later the rendezvous has every worker's latest counters.
  absl::SleepFor(lo.heartbeat_interval + absl::Milliseconds(100));
  std::printf("\n# ring health\n");
  auto h = clients[0]->RingHealth();
  if (!h.ok()) return Fail(h.status());
  std::printf("%s", FormatHealth(*h).c_str());
  std::printf("\n# stopping the embedded cluster\n");
  std::fflush(stdout);
  owned.clear();
  clients.clear();
  cluster->reset();
  std::printf("\n%s\n", rc == 0 ? "demo: every result matched the float64 "
                                  "reference on every rank (#wrong 0)"
                                : "demo: SOME RESULTS WERE WRONG OR FAILED");
  return rc;
}

// bench's embedded cluster, as the flags describe it for these cases, and
// a client of each of its workers (in owned, by rank).
absl::Status StartEmbedded(const std::vector<BenchCase>& cases,
                           Client::Options& co, RemovedAtExit& cert_dir,
                           std::unique_ptr<LocalCluster>* cluster,
                           std::vector<std::unique_ptr<Client>>& owned) {
  LocalCluster::Options lo;
  lo.workers = absl::GetFlag(FLAGS_workers);
  lo.chunk_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_chunk_bytes));
  lo.shm_links = absl::GetFlag(FLAGS_shm_links);
  lo.shm_spin = absl::Microseconds(absl::GetFlag(FLAGS_shm_spin_us));
  lo.wire_links = absl::GetFlag(FLAGS_wire_links);
  lo.wire_landing = absl::GetFlag(FLAGS_wire_landing);
  lo.wire_tap = absl::GetFlag(FLAGS_wire_tap);
  lo.wire_congestion = absl::GetFlag(FLAGS_wire_congestion);
  const int hosts = absl::GetFlag(FLAGS_hosts);
  if (hosts < 0 || hosts > lo.workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--hosts=", hosts, " must be in [0, --workers=", lo.workers, "]"));
  }
  for (int r = 0; hosts > 0 && r < lo.workers; ++r) {
    lo.hosts.push_back(absl::StrCat("h", r % hosts));
  }
  for (const BenchCase& bc : cases) {
    if (bc.algorithm == Algorithm::kParameterServer) {
      lo.ps_shards = absl::GetFlag(FLAGS_ps_shards);
    }
  }
  const std::string tls_dir = absl::GetFlag(FLAGS_tls_dir);
  if (!tls_dir.empty() && !absl::GetFlag(FLAGS_tls)) {
    return absl::InvalidArgumentError("--tls_dir needs --tls");
  }
  if (absl::GetFlag(FLAGS_tls)) {
    absl::Status s = tls_dir.empty()
                         ? MakeThrowawayCertificates(lo, cert_dir)
                         : UseCertificates(tls_dir, lo);
    if (!s.ok()) return s;
    std::printf(
        "# mutual TLS and a job token on every channel; wire links sealed "
        "with %s by %s\n",
        WireSeal::kName, WireSeal::Engine());
  }
  auto c = LocalCluster::Start(lo);
  if (!c.ok()) return c.status();
  *cluster = std::move(*c);
  // The clients' session rings poll as long (auto: not at all).
  co.shm_spin = std::max(lo.shm_spin, absl::ZeroDuration());
  for (int r = 0; r < (*cluster)->size(); ++r) {
    auto cl = (*cluster)->Connect(r, co);
    if (!cl.ok()) return cl.status();
    owned.push_back(std::move(*cl));
  }
  return absl::OkStatus();
}

// A client of each worker --worker lists (`workers`), in owned by rank.
absl::Status ConnectByRank(const std::string& workers,
                           const Client::Options& co,
                           std::vector<std::unique_ptr<Client>>& owned) {
  for (absl::string_view addr : absl::StrSplit(workers, ',')) {
    auto cl = Client::Connect(std::string(addr), co);
    if (!cl.ok()) return cl.status();
    owned.push_back(std::move(*cl));
  }
  // Order the clients by their workers' ranks.
  std::vector<std::unique_ptr<Client>> by_rank(owned.size());
  for (auto& cl : owned) {
    auto info = cl->Info();
    if (!info.ok()) return info.status();
    if (info->world_size != static_cast<int>(owned.size()) ||
        by_rank[info->rank]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--worker must list every worker of the job once (world size ",
          info->world_size, ")"));
    }
    by_rank[info->rank] = std::move(cl);
  }
  owned = std::move(by_rank);
  return absl::OkStatus();
}

int BenchCommand() {
  auto cases = SweepCases();
  if (!cases.ok()) return Fail(cases.status());
  absl::StatusOr<Client::Options> co = ClientOptionsFromFlags();
  if (!co.ok()) return Fail(co.status());
  RemovedAtExit cert_dir;  // declared first: outlives the cluster using it
  std::unique_ptr<LocalCluster> cluster;
  std::vector<std::unique_ptr<Client>> owned;
  std::vector<Client*> clients;
  const std::string workers = absl::GetFlag(FLAGS_worker);
  if (!workers.empty() && (absl::GetFlag(FLAGS_shm_spin_us) != -1 ||
                           !absl::GetFlag(FLAGS_tls_dir).empty() ||
                           absl::GetFlag(FLAGS_hosts) != 0)) {
    return Fail(absl::InvalidArgumentError(
        "--shm_spin_us, --tls_dir and --hosts set up the embedded cluster; "
        "with --worker, give them to the workers (halka-worker "
        "--shm_spin_us, --tls_ca/--tls_cert/--tls_key, --host_id)"));
  }
  if (workers.empty()) {
    absl::Status s = StartEmbedded(*cases, *co, cert_dir, &cluster, owned);
    if (!s.ok()) return Fail(s);
  } else {
    absl::Status s = ConnectByRank(workers, *co, owned);
    if (!s.ok()) return Fail(s);
  }
  for (auto& c : owned) clients.push_back(c.get());
  int rc = Bench(clients, *cases, OptionsFromFlags(), absl::GetFlag(FLAGS_json));
  const std::string trace = absl::GetFlag(FLAGS_trace);
  if (!trace.empty()) {
    absl::StatusOr<v1::RingHealth> h = ClientProto::RingHealth(*clients[0]);
    if (!h.ok()) return Fail(h.status());
    if (int t = WriteTrace(*h, trace); t != 0) rc = t;
  }
  return rc;
}

}  // namespace
}  // namespace halka

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "halkactl demo|bench|allreduce|health [flags]; see --help");
  if (argc < 2 || argv[1][0] == '-') {
    std::fprintf(stderr,
                 "usage: halkactl demo|bench|allreduce|health [flags]\n"
                 "  demo       embedded 4-worker ring: checked results table "
                 "and ring health\n"
                 "  bench      nccl-tests style sweep (-b -e -f -n -w -c)\n"
                 "  allreduce  one all-reduce through a running worker\n"
                 "  health     ring health of a running job (exit 2 unless "
                 "healthy); --json, --watch [--interval=2s] [--watch_count=N]\n"
                 "  healthcheck --worker=ADDR  standard gRPC health of any "
                 "halka server (exit 0 if SERVING)\n"
                 "  trace      --rendezvous=ADDR --job=ID -o FILE: every "
                 "rank's timeline as one Chrome trace\n");
    return 2;
  }
  const std::string cmd = argv[1];
  std::vector<char*> rest = {argv[0]};
  for (int i = 2; i < argc; ++i) rest.push_back(argv[i]);
  absl::ParseCommandLine(static_cast<int>(rest.size()), rest.data());
  halka::SetLogTag("halkactl");
  // Calls name no job: workers take any job's caller with their token, the
  // rendezvous checks the token against the job in each request.
  if (absl::Status s = halka::InitSecurityFromFlags(""); !s.ok()) {
    halka::LogError(s.ToString());
    return 2;
  }
  if (cmd == "demo") return halka::Demo();
  if (cmd == "bench") return halka::BenchCommand();
  if (cmd == "allreduce") {
    absl::StatusOr<halka::Client::Options> co = halka::ClientOptionsFromFlags();
    if (!co.ok()) return halka::Fail(co.status());
    return halka::AllReduceCommand(*co);
  }
  if (cmd == "healthcheck") return halka::HealthCheck(absl::GetFlag(FLAGS_worker));
  if (cmd == "trace") {
    return halka::Trace(absl::GetFlag(FLAGS_rendezvous),
                        absl::GetFlag(FLAGS_job), absl::GetFlag(FLAGS_o));
  }
  if (cmd == "health") {
    return halka::HealthCommand();
  }
  std::fprintf(stderr, "halkactl: unknown command '%s'\n", cmd.c_str());
  return 2;
}
