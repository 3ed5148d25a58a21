// AES-128-OCB (RFC 7253, 96-bit nonces, 128-bit tags) on VAES-512: an
// opt-in sealing engine for wire links (seal/wire_seal.h,
// WireSealEngine::kVaes512; OpenSSL's OCB seals by default), sixteen blocks
// at a time in four 512-bit registers.
//
// Why it exists: OpenSSL 3.0's OCB interleaves six 128-bit AES-NI blocks
// and runs at the 128-bit AES units' rate (9-10 GB/s on 1 MiB records on a
// Zen 4 core); VAES does four blocks per instruction (22 GB/s there), and
// under TLS the cipher is most of what a wire link costs on two cores
// (docs/performance.md). The output is OCB's, byte for byte: a peer that
// seals with OpenSSL opens what this seals and the other way round.
// Before a process seals with it, WireOcbSelfTest must pass
// (WireSeal::CheckEngine runs it); tests/unit/wire_ocb_test.cc checks it
// against RFC 7253's vectors and OpenSSL over lengths, splits and nonces.
//
// The offsets of a group of sixteen blocks are its first offset XORed with
// fifteen constant prefixes of OCB's L table (the blocks' trailing-zero
// counts repeat every sixteen blocks) and, for the sixteenth, one entry
// that depends on the group's index: no serial chain per block.
#ifndef HALKA_SEAL_WIRE_OCB_H_
#define HALKA_SEAL_WIRE_OCB_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace halka {

class WireOcb {
 public:
  static constexpr size_t kNonceBytes = 12;
  static constexpr size_t kTagBytes = 16;
  // Whether this CPU (and its OS) runs this code: x86-64 with AES-NI,
  // VAES, AVX-512F and AVX-512VL. Construct a WireOcb only where it does.
  static bool Supported();

  explicit WireOcb(const uint8_t key[16]);
  // Wipes the key schedule and the unit's state (OPENSSL_cleanse).
  ~WireOcb();
  WireOcb(const WireOcb&) = delete;
  WireOcb& operator=(const WireOcb&) = delete;

  // Sealing one unit in pieces: Begin, Update as often as needed (the
  // ciphertext goes to `out` given at Begin, back to back), Finish (the
  // last partial block, then the tag right after the ciphertext).
  void Begin(const uint8_t nonce[kNonceBytes], const uint8_t* aad,
             size_t aad_n, uint8_t* out);
  void Update(const uint8_t* in, size_t n);
  void Finish();

  // Opens data[0, n) in place and checks it against `tag` (in constant
  // time: CRYPTO_memcmp). False when the unit is not authentic (its bytes
  // are then garbage, as with OpenSSL's in-place decryption: the caller
  // drops them).
  bool Open(const uint8_t nonce[kNonceBytes], const uint8_t* aad,
            size_t aad_n, uint8_t* data, size_t n,
            const uint8_t tag[kTagBytes]);

 private:
  friend struct WireOcbKernels;
  // Round keys (sealing, then opening: the inverse schedule).
  alignas(64) uint8_t enc_[11][16];
  alignas(64) uint8_t dec_[11][16];
  // OCB's L_*, L_$ and L_0..L_63.
  alignas(16) uint8_t l_star_[16];
  alignas(16) uint8_t l_dollar_[16];
  alignas(16) uint8_t l_[64][16];
  // The offsets of blocks 1..16 of a group relative to the one before it
  // (the sixteenth still lacks its L_{4 + ntz(group)}).
  alignas(64) uint8_t prefix_[16][16];
  // One unit's state.
  alignas(16) uint8_t offset_[16];
  alignas(16) uint8_t checksum_[16];
  alignas(16) uint8_t hash_[16];
  alignas(16) uint8_t carry_[16];
  size_t carry_n_ = 0;
  uint64_t blocks_ = 0;
  uint8_t* out_ = nullptr;
};

// One known answer, all in hex (lower case): `sealed` is AES-128-OCB (TAGLEN
// 128) of `plain` under `key` with `nonce` (12 bytes) and `aad`, the
// ciphertext then the 16-byte tag.
struct WireOcbVector {
  const char* key;
  const char* nonce;
  const char* aad;
  const char* plain;
  const char* sealed;
};

// RFC 7253 Appendix A's sixteen AES-128, TAGLEN 128 samples (key
// 000102...0f; associated data and plaintext of 0, 8, 16, 24, 32 and 40
// bytes).
absl::Span<const WireOcbVector> WireOcbRfc7253Vectors();

// The known-answer self-test of WireOcb, run before a process seals with
// it: each of `vectors` sealed in one piece and in two must give `sealed`
// and open back to `plain`, and refuse the unit with its tag altered; RFC
// 7253's iterated test (128 lengths of associated data and plaintext, then
// their 22,400 bytes of output as associated data) must give its tag
// 67e944d23256c5e0b6c61fa22fdf1ea2; and a unit of 16 KiB + 7 bytes (the
// sixteen-block VAES groups, which the short vectors never reach) must be
// what OpenSSL's EVP AES-128-OCB writes and open back. Errors:
// FAILED_PRECONDITION where this CPU cannot run WireOcb (Supported());
// INTERNAL naming the first check that fails.
absl::Status WireOcbSelfTest(
    absl::Span<const WireOcbVector> vectors = WireOcbRfc7253Vectors());

}  // namespace halka

#endif  // HALKA_SEAL_WIRE_OCB_H_
