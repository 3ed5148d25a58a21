// The sealing of wire links (worker/wire_link.h) under TLS: AES-128-OCB
// (RFC 7253) over each unit of a connection, a counter of the units as the
// nonce, so an altered, replayed, dropped or reordered unit fails.
// Our own OCB on VAES-512 where the CPU has it (worker/wire_ocb.h), else
// OpenSSL's libcrypto: the same bytes either way. No sockets here.
//
// Why OCB and not GCM: on the CPUs at hand OpenSSL 3.0's GCM is held back
// by GHASH (3.6 GB/s on 1 MiB records in place on this machine's AMD EPYC,
// against 10.2 GB/s for OCB: one pass of AES, parallel across blocks), and
// under TLS the cipher is most of what a wire link costs on two cores
// (docs/performance.md).
#ifndef HALKA_WORKER_WIRE_SEAL_H_
#define HALKA_WORKER_WIRE_SEAL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace halka {

class WireOcb;

// AES-128-OCB over the units of one connection, in one direction (one
// instance seals, another opens). The key schedule is made once.
class WireSeal {
 public:
  static constexpr size_t kKeyBytes = 16;
  static constexpr size_t kTagBytes = 16;
  // What a wire offer names the sealing by (worker/wire_link.h).
  static constexpr char kName[] = "aes-128-ocb";
  // Which code seals: "vaes-512" (worker/wire_ocb.h) on CPUs with VAES
  // and AVX-512, else "openssl" (libcrypto's AES-NI OCB). Both write the
  // same bytes. HALKA_WIRE_OCB=openssl in the environment picks OpenSSL
  // everywhere (for comparisons).
  static const char* Engine();
  // A fresh random key (OpenSSL's RAND_bytes). Errors: INTERNAL.
  static absl::StatusOr<std::string> NewKey();
  explicit WireSeal(std::string key);
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

 private:
  // The context for sealing (true) or opening, keyed on first use.
  void* Ctx(bool seal);
  void NextNonce(uint8_t nonce[12]);
  const std::string key_;
  uint64_t counter_ = 0;
  void* seal_ctx_ = nullptr;  // EVP_CIPHER_CTX
  void* open_ctx_ = nullptr;
  std::unique_ptr<WireOcb> fast_;  // where Engine() is "vaes-512"
};

// n bytes from a cryptographic random source (keys, tokens). INTERNAL
// when it fails.
absl::StatusOr<std::string> WireRandomBytes(size_t n);

// Hex of bytes, and back ("" for anything that is not even-length hex).
std::string WireHex(absl::string_view bytes);
std::string WireUnhex(absl::string_view hex);

}  // namespace halka

#endif  // HALKA_WORKER_WIRE_SEAL_H_
