// The sealing of wire links (transport/tcp/wire_link.h) under TLS: AES-128-OCB
// (RFC 7253) over each unit of a connection, a counter of the units as the
// nonce, so an altered, replayed, dropped or reordered unit fails.
// OpenSSL's libcrypto (EVP AES-128-OCB) seals by default; halka's own OCB
// on VAES-512 (seal/wire_ocb.h) only where a process opts in to it
// (WireSealEngine, halka-worker's --wire_ocb, HALKA_WIRE_OCB), and only
// after its known-answer self-test passes. The same bytes either way. No
// sockets here.
//
// Why OCB and not GCM: on the CPUs at hand OpenSSL 3.0's GCM is held back
// by GHASH (3.6 GB/s on 1 MiB records in place on this machine's AMD EPYC,
// against 10.2 GB/s for OCB: one pass of AES, parallel across blocks), and
// under TLS the cipher is most of what a wire link costs on two cores
// (docs/performance.md).
#ifndef HALKA_SEAL_WIRE_SEAL_H_
#define HALKA_SEAL_WIRE_SEAL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace halka {

class WireOcb;

// Which code seals wire links. Both write AES-128-OCB's bytes exactly, so
// peers with different engines open each other's units.
enum class WireSealEngine {
  kOpenSsl,  // "openssl": libcrypto's EVP AES-128-OCB, the default
  kVaes512,  // "vaes-512": WireOcb (seal/wire_ocb.h), opt-in
};
const char* WireSealEngineName(WireSealEngine engine);
// "openssl" or "vaes-512". Errors: INVALID_ARGUMENT.
absl::StatusOr<WireSealEngine> ParseWireSealEngine(absl::string_view name);

// Overwrites a string that held a raw key (or its hex) with OPENSSL_cleanse
// over its whole buffer, then empties it: before the buffer is freed.
void WipeKey(std::string* key);

// A raw key (or a string carrying one) that is wiped (WipeKey) when it
// goes, when it is assigned over and when it is moved from; each copy wipes
// its own buffer.
class WipedKey {
 public:
  WipedKey() = default;
  explicit WipedKey(std::string key) : key_(std::move(key)) {}
  WipedKey(const WipedKey&) = default;
  WipedKey(WipedKey&& other) noexcept : key_(std::move(other.key_)) {
    WipeKey(&other.key_);
  }
  WipedKey& operator=(const WipedKey& other) {
    if (this != &other) {
      WipeKey(&key_);
      key_ = other.key_;
    }
    return *this;
  }
  WipedKey& operator=(WipedKey&& other) noexcept {
    if (this != &other) {
      WipeKey(&key_);
      key_ = std::move(other.key_);
      WipeKey(&other.key_);
    }
    return *this;
  }
  ~WipedKey() { WipeKey(&key_); }
  const std::string& str() const { return key_; }
  bool empty() const { return key_.empty(); }

 private:
  std::string key_;
};

// AES-128-OCB over the units of one connection, in one direction (one
// instance seals, another opens). The key schedule is made once.
class WireSeal {
 public:
  static constexpr size_t kKeyBytes = 16;
  static constexpr size_t kTagBytes = 16;
  // What a wire offer names the sealing by (transport/tcp/wire_link.h).
  static constexpr char kName[] = "aes-128-ocb";
  // The engine this process's wire links seal with. It is process-wide:
  // keys reach WireSeal through the links' code (transport/grpc/grpc_transport.cc,
  // transport/grpc/peer_service.cc, transport/tcp/wire_link.h), which carries no options,
  // so it is set once at start-up, before any link: SetDefaultEngine
  // (halka-worker's --wire_ocb), or else HALKA_WIRE_OCB=openssl|vaes-512 in
  // the environment, read at first use (a process that asks for vaes-512
  // where CheckEngine refuses it exits with status 2 and says why); unset,
  // "openssl".
  static WireSealEngine DefaultEngine();
  // DefaultEngine's name: "openssl" or "vaes-512".
  static const char* Engine() { return WireSealEngineName(DefaultEngine()); }
  // Whether `engine` may seal here: OpenSSL always; vaes-512 where the CPU
  // has VAES, AVX-512F and AVX-512VL and WireOcbSelfTest passes (run once
  // per process, its result kept). Errors: FAILED_PRECONDITION, saying why.
  static absl::Status CheckEngine(WireSealEngine engine);
  // Makes `engine` the process's DefaultEngine. Errors: CheckEngine's (the
  // default is then unchanged).
  static absl::Status SetDefaultEngine(WireSealEngine engine);
  // A fresh random key (OpenSSL's RAND_bytes). Errors: INTERNAL.
  static absl::StatusOr<std::string> NewKey();
  explicit WireSeal(std::string key) : WireSeal(std::move(key), DefaultEngine()) {}
  // With a given engine; vaes-512 only where CheckEngine says it may (else
  // the process aborts: a caller's bug).
  WireSeal(std::string key, WireSealEngine engine);
  // Wipes the key (WipeKey); WireOcb and OpenSSL wipe their schedules.
  ~WireSeal();
  WireSeal(const WireSeal&) = delete;
  WireSeal& operator=(const WireSeal&) = delete;
  // Encrypts the parts (back to back) into `out` (their total size plus
  // kTagBytes: the ciphertext, then the tag), with `aad` authenticated
  // too. Uses the next nonce.
  absl::Status Seal(absl::Span<const absl::Span<const uint8_t>> parts,
                    absl::Span<const uint8_t> aad, uint8_t* out);
  // Decrypts data[0, n) in place and checks it against `tag` (16 bytes;
  // by default data[n, n + 16)). Uses the next nonce. Errors: DATA_LOSS
  // when the unit is not authentic.
  absl::Status Open(uint8_t* data, size_t n, absl::Span<const uint8_t> aad,
                    const uint8_t* tag = nullptr);
  // Passes over one unit unopened (its nonce is used up): a unit that is
  // dropped unread.
  void Skip() { ++counter_; }
  WireSealEngine engine() const {
    return fast_ != nullptr ? WireSealEngine::kVaes512 : WireSealEngine::kOpenSsl;
  }

 private:
  // The context for sealing (true) or opening, keyed on first use.
  void* Ctx(bool seal);
  void NextNonce(uint8_t nonce[12]);
  std::string key_;  // wiped when this goes
  uint64_t counter_ = 0;
  void* seal_ctx_ = nullptr;  // EVP_CIPHER_CTX
  void* open_ctx_ = nullptr;
  std::unique_ptr<WireOcb> fast_;  // engine vaes-512
};

// n bytes from a cryptographic random source (keys, tokens). INTERNAL
// when it fails.
absl::StatusOr<std::string> WireRandomBytes(size_t n);

// Hex of bytes, and back ("" for anything that is not even-length hex).
std::string WireHex(absl::string_view bytes);
std::string WireUnhex(absl::string_view hex);

}  // namespace halka

#endif  // HALKA_SEAL_WIRE_SEAL_H_
