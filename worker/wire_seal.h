// The sealing of wire links (worker/wire_link.h) under TLS: AES-128-GCM
// over each record of a connection, the record counter as the nonce, so an
// altered, replayed, dropped or reordered record fails. OpenSSL's
// libcrypto; no sockets here.
#ifndef HALKA_WORKER_WIRE_SEAL_H_
#define HALKA_WORKER_WIRE_SEAL_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace halka {

// AES-128-GCM over the records of one connection, in one direction.
class WireSeal {
 public:
  static constexpr size_t kKeyBytes = 16;
  static constexpr size_t kTagBytes = 16;
  // A fresh random key (OpenSSL's RAND_bytes). Errors: INTERNAL.
  static absl::StatusOr<std::string> NewKey();
  explicit WireSeal(std::string key);
  ~WireSeal();
  WireSeal(const WireSeal&) = delete;
  WireSeal& operator=(const WireSeal&) = delete;
  // Encrypts the parts (back to back) into `out` (their total size plus
  // kTagBytes), with `aad` authenticated too. Uses the next nonce.
  absl::Status Seal(absl::Span<const absl::Span<const uint8_t>> parts,
                    absl::Span<const uint8_t> aad, uint8_t* out);
  // Decrypts data[0, n) in place and checks the tag at data[n, n + 16).
  // Errors: DATA_LOSS when the record is not authentic.
  absl::Status Open(uint8_t* data, size_t n, absl::Span<const uint8_t> aad);
  // The same in parts, for a reader that places a record's pieces as they
  // come: OpenBegin (takes the next nonce), OpenPart over the ciphertext in
  // order (in place; a part is plaintext once decrypted but authentic only
  // after OpenEnd), OpenEnd with the record's tag. Errors: INTERNAL, and
  // DATA_LOSS from OpenEnd when the record is not authentic.
  absl::Status OpenBegin(absl::Span<const uint8_t> aad);
  absl::Status OpenPart(uint8_t* data, size_t n);
  absl::Status OpenEnd(const uint8_t* tag);

 private:
  void NextNonce(uint8_t nonce[12]);
  const std::string key_;
  uint64_t counter_ = 0;
  void* ctx_ = nullptr;  // EVP_CIPHER_CTX
};

// n bytes from a cryptographic random source (keys, tokens). INTERNAL
// when it fails.
absl::StatusOr<std::string> WireRandomBytes(size_t n);

// Hex of bytes, and back ("" for anything that is not even-length hex).
std::string WireHex(absl::string_view bytes);
std::string WireUnhex(absl::string_view hex);

}  // namespace halka

#endif  // HALKA_WORKER_WIRE_SEAL_H_
