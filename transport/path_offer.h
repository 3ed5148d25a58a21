// How a link agrees on its path: each path kind other than the gRPC stream
// has one PathOffer (the dialling end, one per link) and one PathAcceptor
// (the serving end, one per worker). The gRPC transport and the peer
// service speak only these interfaces; transport/paths.h lists the kinds
// and which of them a link offers or takes. Adding a kind: a folder with
// its LinkPath, offer and acceptor, and a line in paths.cc.
//
// The exchange, on the gRPC stream that opens every link:
//   1. The dialling end adds each offer's (key, value) to its call
//      metadata, fastest kind first (PathKind's order).
//   2. The serving end goes through the offers in the same order and
//      answers each under its answer_key: the first one it can take it
//      takes, and it answers no offer after that one (a link never holds
//      two paths). A refused offer's answer says why ("no: …").
//   3. The dialling end reads the answers in the same order (ChoosePath):
//      the first offer whose answer it accepts is the link's path; the ones
//      before it were refused, the ones after it were not considered.
// Until then the link's frames wait; from then on every frame takes that
// path (or the stream), so frames stay in order.
#ifndef HALKA_TRANSPORT_PATH_OFFER_H_
#define HALKA_TRANSPORT_PATH_OFFER_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/frame.h"
#include "core/transport.h"
#include "transport/link_path.h"

namespace halka {

// What both ends of one kind's negotiation name: the kind, and the call
// metadata keys of its offer and answer.
class PathKeys {
 public:
  virtual ~PathKeys() = default;
  virtual PathKind kind() const = 0;
  virtual const char* offer_key() const = 0;
  virtual const char* answer_key() const = 0;
};

// The dialling end of one kind's negotiation, for one link. Not
// thread-safe: the link calls it under its own lock.
class PathOffer : public PathKeys {
 public:
  // The offer's value; it may hold a secret, which the caller wipes
  // (WipeKey) once it has handed it to the call.
  virtual std::string value() = 0;
  // Whether the serving end's answer takes the offer.
  virtual bool Accepts(const std::string& answer) const = 0;

  // What Open gives the link: the path, and whether it carries frames at
  // once (else `ready` runs once it does, or once it cannot).
  struct Opened {
    std::shared_ptr<LinkPath> path;
    bool ready_now = false;
  };
  // The callbacks of a path that is still opening, or that breaks later.
  // They run on the path's own thread, never inside Open.
  struct Events {
    // The path carries frames now (OK), or could not be opened (the
    // link's frames take the gRPC stream; the offer is not made again to
    // that peer for a while).
    std::function<void(const absl::Status&)> ready;
    // The open path broke: the link's failure.
    std::function<void(const absl::Status&)> failed;
  };
  // The chosen offer, after an answer it Accepts.
  virtual absl::StatusOr<Opened> Open(const std::string& answer,
                                      Events events) = 0;
  // The opened path carries frames (OK: at once when ready_now, else
  // when `ready` said so), or could not be opened (`ready`'s error).
  virtual void OnReady(const absl::Status& status) { (void)status; }
  // The serving end answered and refused the offer (or took none).
  virtual void Refused() {}
  // The exchange is over, whatever came of it (taken, refused, not
  // answered, or the stream ended first): release what only the exchange
  // needed (for example a ring's name).
  virtual void Settled() {}
};

// What a serving link gives the path it takes: who sends, the inbox of the
// link's generation, and where frames and failures go.
struct InPathEnd {
  int from = -1;
  std::shared_ptr<Inbox> inbox;
  // Checks a frame against the link and delivers it; an error ends the
  // path (the callee has reported it).
  std::function<absl::Status(absl::StatusOr<InFrame>)> deliver;
  // Ends the gRPC stream with a frame's rejection (already reported).
  std::function<void(const absl::Status&)> rejected;
  // The path itself broke (corrupt, or cut mid-record): report it and end
  // the link.
  std::function<void(const absl::Status&)> failed;
};

// The serving end of one accepted path. Stop() delivers what arrived
// before it (as far as the kind can), ends the path's threads and waits
// for them: no callback of the InPathEnd runs after it returns.
class InPath {
 public:
  virtual ~InPath() = default;
  virtual void Stop() = 0;
};

// The serving end of one kind's negotiation, shared by a worker's links.
// Thread-safe.
class PathAcceptor : public PathKeys {
 public:
  struct Answer {
    // What goes back under answer_key (printable ASCII).
    std::string text;
    // Null: refused (text says why).
    std::unique_ptr<InPath> path;
  };
  // Takes the offer `value` for the link `end`, or says why not.
  virtual Answer Accept(const std::string& value, InPathEnd end) = 0;
};

}  // namespace halka

#endif  // HALKA_TRANSPORT_PATH_OFFER_H_
