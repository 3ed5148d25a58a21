// The wire data path of a peer link between hosts: a plain TCP connection
// per link that carries the link's frames instead of its gRPC stream, with
// each frame sealed (AES-128-OCB) when the job runs TLS.
//
// Why: on gRPC's stream every byte crosses HTTP/2 framing and, under TLS,
// gRPC's secure endpoint, which encrypts in 16 KiB records through two
// more copies on each side (docs/performance.md: TLS cost 49-63 % of
// plaintext). On its own connection a frame is one record: sealed in one
// pass on the link's writer thread, opened in place on its reader thread.
//
// Negotiation (transport/grpc/grpc_transport.cc), beside the same-host offer:
//   - the dialling side offers "halka-wire-offer: <offer>" in the link's
//     call metadata, <offer> "aes-128-ocb:<key>" with the link's AES key in
//     hex when its channel is TLS (the metadata travels inside TLS), "-" on
//     a plaintext channel (FormatWireOffer, ParseWireOffer);
//   - the serving side, if it takes wire links, registers a one-time token
//     with its WireListener and answers "halka-wire: ok <port> <token>"
//     (or "no: <why>"). It refuses a plaintext offer when it serves TLS;
//   - the dialling side connects to <peer host>:<port> from the link's
//     writer thread, presents the token and waits for a one-byte ack. Its
//     frames wait until then; after it, they take the wire, and if the
//     connection cannot be made they take the gRPC stream (logged once per
//     peer), so frames stay in order on one path either way.
// The gRPC stream stays open: its end is the link's end, as for same-host
// links. A frame that fails authentication, a record too large, or a token
// nobody expects ends that connection; a broken connection is the link's
// failure, reported to the inbox like a broken stream.
//
// On the connection (dialler to server only; the server sends the ack
// byte and nothing else): 16 token bytes, then records
//   [u32 LE n][n bytes: the frame as codec/frame_codec.h encodes it]
// and, sealed, [u32 LE n][u32 LE h][h bytes][16-byte tag][n - h bytes]
// [16-byte tag]: the frame's head (its first h bytes: [u32 header
// length][header]) and its payload sealed as two units (AES-128-OCB,
// seal/wire_seal.h), both with the 8 length bytes as associated data and
// the nonce a counter of the units on the connection (so a replayed,
// dropped or reordered unit fails). The reader authenticates the head
// before it decides where the payload goes (core/landing.h).
#ifndef HALKA_TRANSPORT_TCP_WIRE_LINK_H_
#define HALKA_TRANSPORT_TCP_WIRE_LINK_H_

#include <sys/uio.h>

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/grpc_util.h"
#include "core/frame.h"
#include "core/landing.h"
#include "core/link_counters.h"
#include "transport/link_path.h"
#include "transport/shm/shm_link.h"
#include "seal/wire_seal.h"

namespace halka {

inline constexpr char kLinkWireOfferKey[] = "halka-wire-offer";
inline constexpr char kLinkWireAnswerKey[] = "halka-wire";

// The dialling side's offer for a link sealed with `key` ("" on a
// plaintext channel: "-").
std::string FormatWireOffer(const std::string& key);
// The key an offer carries ("" for "-"), or why it is refused: a malformed
// key, or a sealing this worker does not speak (an older halka's
// AES-GCM offer; the link then stays on its gRPC stream).
absl::StatusOr<std::string> ParseWireOffer(const std::string& offer);

// The serving side's answer: "ok <port> <token>" (true) or a refusal.
std::string FormatWireAnswer(int port, const std::string& token);
bool ParseWireAnswer(const std::string& answer, int* port, std::string* token);
// One worker's memory of the peers its wire links could not reach: peer
// address -> when its last wire link could not be made. Owned by the
// WorkerNode and shared by its rings' transports, so that one worker's
// failed connection never keeps another worker of the same process from
// offering the wire. Thread-safe.
class WireFallbacks {
 public:
  // `log`: the worker's (it must outlive this object); null: the process's.
  explicit WireFallbacks(const Logger* log = nullptr) : log_(log) {}
  // Logs, once per peer address, that a link to it stays on gRPC and why,
  // and remembers it: links to that address offer no wire for a minute (a
  // blocked port costs each new link the 2 s handshake time otherwise).
  void Note(const std::string& address, const absl::Status& why);
  bool RecentlyFailed(const std::string& address) const;

 private:
  const Logger* const log_;
  mutable absl::Mutex mu_;
  std::map<std::string, absl::Time> last_ ABSL_GUARDED_BY(mu_);
};

// A worker's listening socket for wire links. Each connection must present,
// within 2 s, a token that Expect handed out (once); unknown tokens, slow
// or silent connections are closed. At most 64 connections wait in the
// handshake at once. Thread-safe.
class WireListener {
 public:
  // Binds `host` (the worker's listen host as HostOf gives it, no
  // brackets; "", "0.0.0.0" or "::" for all) on
  // `port` (0: an ephemeral one) and starts the accept thread. Evictions
  // count in `counters` (its worker's; null: counters of its own). Errors:
  // UNAVAILABLE.
  static absl::StatusOr<std::unique_ptr<WireListener>> Start(
      const std::string& host, int port = 0,
      std::shared_ptr<LinkCounters> counters = nullptr);
  ~WireListener();  // Stop()
  void Stop();
  int port() const { return port_; }

  // Takes ownership of the connected socket. Runs on the listener's
  // thread, under its lock: Forget(token) returning means it never runs.
  using OnConnected = std::function<void(int fd)>;
  // A one-time token (hex) for the next connection of one link; it expires
  // after 30 s unused.
  std::string Expect(OnConnected on_connected);
  void Forget(const std::string& token);

 private:
  WireListener(int fd, int wake_fd, int port,
               std::shared_ptr<LinkCounters> counters);
  void Loop();

  struct Waiting {
    OnConnected on_connected;
    absl::Time expires;
  };
  const int fd_;
  const int wake_fd_;  // an eventfd: Stop wakes the loop
  const int port_;
  const std::shared_ptr<LinkCounters> counters_;  // wire.evicted
  absl::Mutex mu_;
  std::map<std::string, Waiting> expected_ ABSL_GUARDED_BY(mu_);  // raw token
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread loop_;
};

// The TCP congestion control of a wire link's dialling (sending) socket,
// chosen once it is connected (before any frame). `wanted`:
//   "auto"    the host's default, except bbr (bbr2, ...) on a link whose
//             round trip (the handshake's, TCP_INFO) is under 1 ms: then
//             cubic, or reno where the kernel lets this process choose
//             only among its allowed ones
//             (net.ipv4.tcp_allowed_congestion_control; reno always is).
//             bbr paces each connection's sending to the rate it
//             estimates; a collective's link sends in bursts, one step at
//             a time, and on this project's loopback runs cubic took
//             14-41 % off 4-16 MiB all-reduces (docs/performance.md,
//             "Congestion control of the wire").
//             A longer round trip (another site, a lossy WAN path), where
//             bbr is chosen for its loss tolerance, keeps it. Not the
//             default: under random loss bbr keeps far more operations
//             within their deadlines (tests/system/faults_test.sh loss:
//             15 % of a worker's packets dropped).
//   "system"  the host's default, whatever it is (the workers' default).
//   a name    that one (cubic, reno, dctcp, bbr, ...).
struct CongestionChoice {
  std::string host;    // the host's default, as `fd` had it
  std::string in_use;  // what `fd` has now
  absl::Duration rtt;  // the round trip the choice read (zero: unknown)
  // What was changed ("TCP congestion control cubic in place of the
  // host's bbr ..."), or what the kernel refused (in_use is then the
  // host's); "" when nothing was asked of the kernel.
  std::string note;
  bool changed() const { return in_use != host; }
  bool refused() const { return !note.empty() && !changed(); }
};
CongestionChoice ChooseCongestion(int fd, const std::string& wanted);
// The round trip below which auto replaces bbr.
inline constexpr absl::Duration kAutoCongestionRtt = absl::Milliseconds(1);
// What ChooseCongestion asks the kernel for, in order, on a socket whose
// host default is `host` and whose round trip is `rtt` (zero: unknown,
// and auto then changes nothing).
std::vector<std::string> CongestionTries(const std::string& host,
                                         const std::string& wanted,
                                         absl::Duration rtt);
// The congestion control a new TCP socket of this network namespace has
// (its default); "" when none can be read.
std::string DefaultCongestion();
// Whether `name` can be a --wire_congestion value: auto, system, or a
// congestion control's name (1-15 of [a-z0-9_]).
bool ValidCongestionName(const std::string& name);

// The dialling end: its thread connects, presents the token, waits for the
// ack, calls on_ready (OK, or why not: the link then stays on gRPC), and
// then writes queued frames in order, sealing each when it has a key. A
// connection that breaks later goes to on_failed once. Frames are released
// once written (or when Close drops them).
class WireSender : public LinkPath {
 public:
  using Frame = OutFrame;
  // `congestion`: ChooseCongestion's `wanted`, applied to the socket
  // once connected; `counters` (null: none) count what came of it, once
  // per link (wire.congestion_changed, wire.congestion_refused).
  WireSender(std::string host, int port, std::string token, std::string key,
             std::function<void(const absl::Status&)> on_ready,
             std::function<void(const absl::Status&)> on_failed,
             std::string congestion = "system",
             std::shared_ptr<LinkCounters> counters = nullptr);
  ~WireSender() override;  // Close()
  // LinkPath: a frame that finds the link idle (connected, nothing queued,
  // no record half written) and is of at most 513 KiB on a plain link, 65
  // KiB on a sealed one (whose sealing stays on the writer's thread), is
  // written at once by the calling thread, without blocking (one
  // sendmsg): what the socket does not take is left for the writer
  // thread, which writes it from the frame itself (a plain link) or from
  // a copy (a sealed record). Every other frame is queued for the
  // writer thread, which releases each frame once written (frames sent
  // before on_ready wait for the connection). HALKA_WIRE_INLINE=0: always
  // queued; HALKA_WIRE_INLINE=small: plain links too at most 65 KiB (to
  // compare).
  void Send(std::vector<OutFrame> frames) override;
  // LinkPath: the operation's queued data frames are dropped; a record of
  // it being written is finished from a copy of its rest (the writer
  // thread copies it within 50 ms). A sealed record's payload is copied
  // when it is sealed, so the frame is released then already.
  void Withdraw(const OpId& op) override;
  // Stops the thread (a write in progress is cut; an idle link ends with
  // its close record), waits for it, and releases what is still queued.
  // Never from the callbacks.
  void Close() override;
  // How many frames the calling threads wrote (all of them), and how many
  // of those the socket took only part of (their rest went to the writer).
  // Of those, `from_frame` left a rest that the writer wrote from the
  // frame itself (not from a copy).
  struct InlineCounts {
    uint64_t frames = 0;
    uint64_t partial = 0;
    uint64_t from_frame = 0;
  };
  InlineCounts inline_counts() const {
    return {inline_frames_.load(), inline_partial_.load(),
            inline_from_frame_.load()};
  }
  // The congestion control the connected socket uses ("" before it
  // connected).
  std::string congestion() const {
    absl::MutexLock lock(&mu_);
    return congestion_.in_use;
  }
  // What ChooseCongestion found and did on the connected socket.
  CongestionChoice congestion_choice() const {
    absl::MutexLock lock(&mu_);
    return congestion_;
  }

 private:
  void Loop();
  absl::Status Connect();
  // The frame as a record: `iov` over `head` and the frame's parts (or, on
  // a sealed link, the sealed units in sealed_: the seal advances).
  absl::Status BuildRecord(Frame& frame, uint8_t head[8],
                           std::vector<iovec>* iov);
  // Writes all of `iov` (the writer thread), waiting while the socket is
  // full; `frame`, if given, is the frame `iov` borrows from: withdrawn
  // meanwhile, its rest is copied and the frame released.
  absl::Status WriteAll(std::vector<iovec>& iov, Frame* frame);
  absl::Status Write(Frame& frame);  // BuildRecord, then WriteAll
  struct Remainder;
  // The rest of a plain record whose frame the caller's thread began.
  absl::Status WriteRest(Remainder& rest);
  // Send's write on the caller's thread; false: queue it instead.
  bool TryInline(OutFrame& frame) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string host_;
  const int port_;
  const std::string token_;  // raw bytes
  std::unique_ptr<WireSeal> seal_;
  const std::function<void(const absl::Status&)> on_ready_;
  const std::function<void(const absl::Status&)> on_failed_;
  const std::string wanted_congestion_;  // ChooseCongestion's `wanted`
  const std::shared_ptr<LinkCounters> counters_;  // may be null
  std::vector<uint8_t> sealed_;  // the writer's buffer for a sealed record
  mutable absl::Mutex mu_;
  std::deque<Frame> queue_ ABSL_GUARDED_BY(mu_);
  CongestionChoice congestion_ ABSL_GUARDED_BY(mu_);
  // The rest of a record the caller's thread began: written before
  // anything in queue_. Either a copy of its bytes, or (a plain link's
  // large frame) the frame itself, of whose record `written` bytes went.
  struct Remainder {
    std::string bytes;
    Frame frame;
    bool of_frame = false;
    size_t written = 0;
  };
  std::unique_ptr<Remainder> remainder_ ABSL_GUARDED_BY(mu_);
  // The operations withdrawn last (Withdraw), oldest first: the job's and
  // its groups' (a group's withdrawal must not hide the job's).
  std::deque<OpId> withdrawn_ops_ ABSL_GUARDED_BY(mu_);
  static constexpr size_t kWithdrawnRemembered = 16;
  std::atomic<uint64_t> inline_frames_{0};
  std::atomic<uint64_t> inline_partial_{0};
  std::atomic<uint64_t> inline_from_frame_{0};
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int fd_ ABSL_GUARDED_BY(mu_) = -1;
  // The link is up and no record is being written: Close may end it with
  // a close record (a record of 0 bytes; sealed, with its tag), so that
  // the reader tells a link that ended from one that was cut.
  bool idle_ ABSL_GUARDED_BY(mu_) = false;
  void WriteCloseRecord() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::thread thread_;
};

// The serving end: a thread that reads records off the connection, opens
// sealed ones, and hands each frame (or what DecodeFrame found wrong with
// it) to on_frame; an error from on_frame stops it. A record that is too
// large or not authentic, or a connection cut inside a record, goes to
// on_error once. The link's normal end is a close record (0 bytes; sealed,
// authenticated) before the connection's end; a connection that ends
// between records without one (cut by the network or a third party, or
// the peer died) also goes to on_error, so that an operation waiting for
// this link fails at once, naming it, instead of at its deadline.
//
// tap() lets an operation's thread read the records itself while it waits
// (Inbox::AddTap; the inbox sleeps on the socket with poll()): one wake-up
// per frame instead of two (the reader's, then the operation's), none for
// a record already there. The tap takes only records of at most
// kTapRecordBytes (kTapPlainRecordBytes on a plain link) that are wholly
// in the socket's queue, so the waiting thread never blocks inside a
// record; any other record it leaves to the reader (the reader's turn,
// which ends once the reader finds the socket empty between records), and
// for 100 ms after a larger record the link is its reader's alone. The
// reader and the tap read under one lock, one whole record at a time, and
// deliver under it (frames stay in order);
// while the tap is attached the reader stands aside (it looks again every
// kParkSlice). The callbacks may run on either thread (on_error with the
// lock released), never after Stop returns.
class WireReceiver {
 public:
  using OnFrame = ShmReceiver::OnFrame;
  using OnError = ShmReceiver::OnError;
  // The largest record the tap reads on an operation's thread on a sealed
  // link (and the most a plain link's tap peeks at once): a 16 KiB payload
  // and its frame's head. A larger sealed record is opened beside the
  // operation's own work by the reader.
  static constexpr size_t kTapRecordBytes = (size_t{16} << 10) + 1024;
  // On a plain link the tap also takes a record of up to a 64 KiB payload
  // and its head, the largest frame of a recursive doubling that `auto`
  // runs up to 64 KiB, whose operation has nothing to do but wait for it:
  // one FIONREAD says it is all there, one recv takes it (measured:
  // docs/performance.md, "The operation's own sendmsg, up to 512 KiB; its
  // own reads, up to 64 KiB"). Not while the operation offers landings
  // (core/landing.h): such a record may be a chunk that lands, the
  // reader's.
  static constexpr size_t kTapPlainRecordBytes = (size_t{64} << 10) + 1024;
  // With `landings` and the sending rank `from`, payloads that an
  // operation offered a landing for go straight into its buffer
  // (core/landing.h): the frame then says `landed`, and counts in
  // `counters` (its worker's wire.landed; null: not counted). Frames the
  // tap read count in wire.tapped. A frame on_frame refuses ends the link;
  // with `on_rejected`, the reader thread reports the refusal there (after
  // read_mu_ is released), else on_frame reports it itself.
  WireReceiver(int fd, std::string key, OnFrame on_frame, OnError on_error,
               std::shared_ptr<LandingBoard> landings = nullptr,
               int from = -1,
               std::shared_ptr<LinkCounters> counters = nullptr,
               OnError on_rejected = nullptr);
  ~WireReceiver();  // Stop(); the connection is shut down
  // Delivers what arrives within 250 ms (the sender's last frames may
  // trail the stream's end), then stops and joins.
  void Stop();
  std::shared_ptr<InboxTap> tap() const;

 private:
  class Core;
  const std::shared_ptr<Core> core_;
  std::thread thread_;
};

}  // namespace halka

#endif  // HALKA_TRANSPORT_TCP_WIRE_LINK_H_
