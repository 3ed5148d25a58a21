#include "seal/wire_ocb.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "seal/wire_seal.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace halka {

namespace {

// OCB's doubling in GF(2^128), on a big-endian 16-byte string.
[[maybe_unused]] void Double(const uint8_t in[16], uint8_t out[16]) {
  const uint8_t carry = in[0] >> 7;
  for (int i = 0; i < 15; ++i) {
    out[i] = static_cast<uint8_t>((in[i] << 1) | (in[i + 1] >> 7));
  }
  out[15] = static_cast<uint8_t>((in[15] << 1) ^ (carry ? 0x87 : 0));
}

[[maybe_unused]] void Xor16(const uint8_t* a, const uint8_t* b, uint8_t* out) {
  for (int i = 0; i < 16; ++i) out[i] = a[i] ^ b[i];
}

}  // namespace

#if defined(__x86_64__)

#define HALKA_AES __attribute__((target("aes,sse4.1")))
#define HALKA_VAES \
  __attribute__((target("aes,sse4.1,avx2,avx512f,avx512vl,vaes")))

struct WireOcbKernels {
  HALKA_AES static __m128i Load(const uint8_t* p) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  }
  HALKA_AES static void Store(uint8_t* p, __m128i v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v);
  }

  HALKA_AES static __m128i KeyStep(__m128i k, __m128i g) {
    g = _mm_shuffle_epi32(g, 0xff);
    k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
    k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
    k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
    return _mm_xor_si128(k, g);
  }

  HALKA_AES static void Expand(const uint8_t key[16], WireOcb* o) {
    __m128i k[11];
    k[0] = Load(key);
    k[1] = KeyStep(k[0], _mm_aeskeygenassist_si128(k[0], 0x01));
    k[2] = KeyStep(k[1], _mm_aeskeygenassist_si128(k[1], 0x02));
    k[3] = KeyStep(k[2], _mm_aeskeygenassist_si128(k[2], 0x04));
    k[4] = KeyStep(k[3], _mm_aeskeygenassist_si128(k[3], 0x08));
    k[5] = KeyStep(k[4], _mm_aeskeygenassist_si128(k[4], 0x10));
    k[6] = KeyStep(k[5], _mm_aeskeygenassist_si128(k[5], 0x20));
    k[7] = KeyStep(k[6], _mm_aeskeygenassist_si128(k[6], 0x40));
    k[8] = KeyStep(k[7], _mm_aeskeygenassist_si128(k[7], 0x80));
    k[9] = KeyStep(k[8], _mm_aeskeygenassist_si128(k[8], 0x1b));
    k[10] = KeyStep(k[9], _mm_aeskeygenassist_si128(k[9], 0x36));
    for (int r = 0; r < 11; ++r) Store(o->enc_[r], k[r]);
    Store(o->dec_[0], k[10]);
    for (int r = 1; r < 10; ++r) Store(o->dec_[r], _mm_aesimc_si128(k[10 - r]));
    Store(o->dec_[10], k[0]);
  }

  HALKA_AES static __m128i Enc1(const WireOcb& o, __m128i x) {
    x = _mm_xor_si128(x, Load(o.enc_[0]));
    for (int r = 1; r < 10; ++r) x = _mm_aesenc_si128(x, Load(o.enc_[r]));
    return _mm_aesenclast_si128(x, Load(o.enc_[10]));
  }

  HALKA_AES static __m128i Dec1(const WireOcb& o, __m128i x) {
    x = _mm_xor_si128(x, Load(o.dec_[0]));
    for (int r = 1; r < 10; ++r) x = _mm_aesdec_si128(x, Load(o.dec_[r]));
    return _mm_aesdeclast_si128(x, Load(o.dec_[10]));
  }

  HALKA_AES static void Encipher(const WireOcb& o, const uint8_t in[16],
                                 uint8_t out[16]) {
    Store(out, Enc1(o, Load(in)));
  }

  // One full block: the unit's next offset, then the block through AES
  // between two XORs of it, and the plaintext into the checksum.
  template <bool kSeal>
  HALKA_AES static void Block(WireOcb* o, const uint8_t* in, uint8_t* out) {
    const uint64_t i = ++o->blocks_;
    const __m128i off =
        _mm_xor_si128(Load(o->offset_), Load(o->l_[__builtin_ctzll(i)]));
    Store(o->offset_, off);
    const __m128i x = Load(in);
    const __m128i y = _mm_xor_si128(
        off, kSeal ? Enc1(*o, _mm_xor_si128(x, off))
                   : Dec1(*o, _mm_xor_si128(x, off)));
    Store(o->checksum_,
          _mm_xor_si128(Load(o->checksum_), kSeal ? x : y));
    Store(out, y);
  }

  template <bool kSeal>
  HALKA_VAES static __m512i Round(__m512i y, __m512i k) {
    return kSeal ? _mm512_aesenc_epi128(y, k) : _mm512_aesdec_epi128(y, k);
  }
  template <bool kSeal>
  HALKA_VAES static __m512i LastRound(__m512i y, __m512i k) {
    return kSeal ? _mm512_aesenclast_epi128(y, k)
                 : _mm512_aesdeclast_epi128(y, k);
  }

  // Groups of sixteen blocks, starting where blocks_ is a multiple of 16:
  // four registers of four blocks, their rounds interleaved.
  template <bool kSeal>
  HALKA_VAES static void Groups(WireOcb* o, const uint8_t* in, uint8_t* out,
                                size_t groups) {
    const auto& rk = kSeal ? o->enc_ : o->dec_;
    __m512i k[11];
    for (int r = 0; r < 11; ++r) {
      k[r] = _mm512_broadcast_i32x4(Load(rk[r]));
    }
    __m512i p[4];
    for (int j = 0; j < 4; ++j) p[j] = _mm512_load_si512(o->prefix_[4 * j]);
    __m512i sum = _mm512_setzero_si512();
    __m128i off = Load(o->offset_);
    uint64_t b = o->blocks_;
    for (size_t g = 0; g < groups; ++g) {
      const __m512i base = _mm512_broadcast_i32x4(off);
      // The sixteenth block's own L_{ntz(16 (group + 1))}, in lane 3.
      const __m512i last = _mm512_maskz_broadcast_i32x4(
          0xF000, Load(o->l_[4 + __builtin_ctzll(b / 16 + 1)]));
      __m512i os[4], x[4], y[4];
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        os[j] = _mm512_ternarylogic_epi64(
            base, p[j], j == 3 ? last : _mm512_setzero_si512(), 0x96);
        x[j] = _mm512_loadu_si512(in + 64 * j);
        y[j] = _mm512_ternarylogic_epi64(x[j], os[j], k[0], 0x96);
      }
      for (int r = 1; r < 10; ++r) {
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) y[j] = Round<kSeal>(y[j], k[r]);
      }
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        // The last round's key XORed with the offset: the output's XOR
        // for free.
        y[j] = LastRound<kSeal>(y[j], _mm512_xor_si512(k[10], os[j]));
        _mm512_storeu_si512(out + 64 * j, y[j]);
      }
      // The checksum is over the plaintext: the input sealing, the output
      // opening.
      const __m512i* plain = kSeal ? x : y;
      sum = _mm512_ternarylogic_epi64(sum, plain[0], plain[1], 0x96);
      sum = _mm512_ternarylogic_epi64(sum, plain[2], plain[3], 0x96);
      off = _mm512_extracti32x4_epi32(os[3], 3);
      b += 16;
      in += 256;
      out += 256;
    }
    const __m128i folded = _mm_xor_si128(
        _mm_xor_si128(_mm512_extracti32x4_epi32(sum, 0),
                      _mm512_extracti32x4_epi32(sum, 1)),
        _mm_xor_si128(_mm512_extracti32x4_epi32(sum, 2),
                      _mm512_extracti32x4_epi32(sum, 3)));
    Store(o->checksum_, _mm_xor_si128(Load(o->checksum_), folded));
    Store(o->offset_, off);
    o->blocks_ = b;
  }

  // n whole blocks from in to out (which may be the same place).
  template <bool kSeal>
  static void Blocks(WireOcb* o, const uint8_t* in, uint8_t* out, size_t n) {
    while (n > 0 && o->blocks_ % 16 != 0) {
      Block<kSeal>(o, in, out);
      in += 16, out += 16, --n;
    }
    if (n >= 16) {
      const size_t groups = n / 16;
      Groups<kSeal>(o, in, out, groups);
      in += groups * 256, out += groups * 256, n -= groups * 16;
    }
    for (; n > 0; --n, in += 16, out += 16) Block<kSeal>(o, in, out);
  }

  // Offset_0 from the nonce (RFC 7253, 4.2, with TAGLEN 128).
  static void Start(WireOcb* o, const uint8_t nonce[12], const uint8_t* aad,
                    size_t aad_n) {
    uint8_t n[16] = {0, 0, 0, 1};
    std::memcpy(n + 4, nonce, 12);
    const int bottom = n[15] & 63;
    n[15] &= 0xC0;
    uint8_t stretch[24];
    Encipher(*o, n, stretch);
    for (int i = 0; i < 8; ++i) stretch[16 + i] = stretch[i] ^ stretch[i + 1];
    const int bytes = bottom / 8;
    const int bits = bottom % 8;
    for (int i = 0; i < 16; ++i) {
      o->offset_[i] = static_cast<uint8_t>(
          (stretch[i + bytes] << bits) |
          (bits == 0 ? 0 : stretch[i + bytes + 1] >> (8 - bits)));
    }
    std::memset(o->checksum_, 0, 16);
    o->blocks_ = 0;
    o->carry_n_ = 0;
    Hash(o, aad, aad_n);
  }

  // HASH(K, A) (RFC 7253, 4.1) into hash_.
  static void Hash(WireOcb* o, const uint8_t* a, size_t n) {
    uint8_t off[16] = {};
    uint8_t sum[16] = {};
    uint8_t t[16];
    uint64_t i = 0;
    for (; n >= 16; a += 16, n -= 16) {
      Xor16(off, o->l_[__builtin_ctzll(++i)], off);
      Xor16(a, off, t);
      Encipher(*o, t, t);
      Xor16(sum, t, sum);
    }
    if (n > 0) {
      Xor16(off, o->l_star_, off);
      std::memset(t, 0, 16);
      std::memcpy(t, a, n);
      t[n] = 0x80;
      Xor16(t, off, t);
      Encipher(*o, t, t);
      Xor16(sum, t, sum);
    }
    std::memcpy(o->hash_, sum, 16);
  }

  // The last partial block (r bytes, 0 < r < 16) in place, and the tag.
  static void End(WireOcb* o, uint8_t* tail, size_t r, bool seal,
                  uint8_t tag[16]) {
    uint8_t t[16];
    if (r > 0) {
      Xor16(o->offset_, o->l_star_, o->offset_);
      uint8_t pad[16];
      Encipher(*o, o->offset_, pad);
      std::memset(t, 0, 16);
      if (seal) std::memcpy(t, tail, r);
      for (size_t j = 0; j < r; ++j) tail[j] ^= pad[j];
      if (!seal) std::memcpy(t, tail, r);
      t[r] = 0x80;
      Xor16(o->checksum_, t, o->checksum_);
    }
    Xor16(o->checksum_, o->offset_, t);
    Xor16(t, o->l_dollar_, t);
    Encipher(*o, t, t);
    Xor16(t, o->hash_, tag);
  }
};

bool WireOcb::Supported() {
  return __builtin_cpu_supports("aes") && __builtin_cpu_supports("sse4.1") &&
         __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("vaes");
}

WireOcb::WireOcb(const uint8_t key[16]) {
  if (!Supported()) std::abort();  // a caller's bug: see Supported()
  WireOcbKernels::Expand(key, this);
  const uint8_t zero[16] = {};
  WireOcbKernels::Encipher(*this, zero, l_star_);
  Double(l_star_, l_dollar_);
  Double(l_dollar_, l_[0]);
  for (int i = 1; i < 64; ++i) Double(l_[i - 1], l_[i]);
  // prefix_[m - 1] = L_{ntz(1)} ^ ... ^ L_{ntz(m)}; the sixteenth gets its
  // L_{4 + ntz(group)} per group.
  uint8_t acc[16] = {};
  for (int m = 1; m <= 15; ++m) {
    Xor16(acc, l_[__builtin_ctz(m)], acc);
    std::memcpy(prefix_[m - 1], acc, 16);
  }
  std::memcpy(prefix_[15], acc, 16);
}

WireOcb::~WireOcb() {
  OPENSSL_cleanse(enc_, sizeof(enc_));
  OPENSSL_cleanse(dec_, sizeof(dec_));
  OPENSSL_cleanse(l_star_, sizeof(l_star_));
  OPENSSL_cleanse(l_dollar_, sizeof(l_dollar_));
  OPENSSL_cleanse(l_, sizeof(l_));
  OPENSSL_cleanse(prefix_, sizeof(prefix_));
  OPENSSL_cleanse(offset_, sizeof(offset_));
  OPENSSL_cleanse(checksum_, sizeof(checksum_));
  OPENSSL_cleanse(hash_, sizeof(hash_));
  OPENSSL_cleanse(carry_, sizeof(carry_));
}

void WireOcb::Begin(const uint8_t nonce[kNonceBytes], const uint8_t* aad,
                    size_t aad_n, uint8_t* out) {
  WireOcbKernels::Start(this, nonce, aad, aad_n);
  out_ = out;
}

void WireOcb::Update(const uint8_t* in, size_t n) {
  if (n == 0) return;
  if (carry_n_ > 0) {
    const size_t take = n < 16 - carry_n_ ? n : 16 - carry_n_;
    std::memcpy(carry_ + carry_n_, in, take);
    carry_n_ += take;
    in += take;
    n -= take;
    if (carry_n_ < 16) return;
    WireOcbKernels::Blocks<true>(this, carry_, out_, 1);
    out_ += 16;
    carry_n_ = 0;
  }
  const size_t whole = n / 16;
  WireOcbKernels::Blocks<true>(this, in, out_, whole);
  out_ += whole * 16;
  carry_n_ = n % 16;
  std::memcpy(carry_, in + whole * 16, carry_n_);
}

void WireOcb::Finish() {
  std::memcpy(out_, carry_, carry_n_);
  uint8_t tag[16];
  WireOcbKernels::End(this, out_, carry_n_, /*seal=*/true, tag);
  std::memcpy(out_ + carry_n_, tag, 16);
  out_ = nullptr;
  carry_n_ = 0;
}

bool WireOcb::Open(const uint8_t nonce[kNonceBytes], const uint8_t* aad,
                   size_t aad_n, uint8_t* data, size_t n,
                   const uint8_t tag[kTagBytes]) {
  WireOcbKernels::Start(this, nonce, aad, aad_n);
  WireOcbKernels::Blocks<false>(this, data, data, n / 16);
  uint8_t want[16];
  WireOcbKernels::End(this, data + n / 16 * 16, n % 16, /*seal=*/false, want);
  // In constant time: a forger learns nothing from how long this takes.
  return CRYPTO_memcmp(want, tag, kTagBytes) == 0;
}

#else  // not x86-64: never Supported(), so never constructed.

WireOcb::~WireOcb() = default;

bool WireOcb::Supported() { return false; }
WireOcb::WireOcb(const uint8_t*) { std::abort(); }
void WireOcb::Begin(const uint8_t*, const uint8_t*, size_t, uint8_t*) {
  std::abort();
}
void WireOcb::Update(const uint8_t*, size_t) { std::abort(); }
void WireOcb::Finish() { std::abort(); }
bool WireOcb::Open(const uint8_t*, const uint8_t*, size_t, uint8_t*, size_t,
                   const uint8_t*) {
  std::abort();
}

#endif

// ---- Known answers

absl::Span<const WireOcbVector> WireOcbRfc7253Vectors() {
  static constexpr char kKey[] = "000102030405060708090a0b0c0d0e0f";
  static constexpr char k8[] = "0001020304050607";
  static constexpr char k16[] = "000102030405060708090a0b0c0d0e0f";
  static constexpr char k24[] =
      "000102030405060708090a0b0c0d0e0f1011121314151617";
  static constexpr char k32[] =
      "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
  static constexpr char k40[] =
      "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
      "2021222324252627";
  static constexpr WireOcbVector kVectors[] = {
      {kKey, "bbaa99887766554433221100", "", "",
       "785407bfffc8ad9edcc5520ac9111ee6"},
      {kKey, "bbaa99887766554433221101", k8, k8,
       "6820b3657b6f615a5725bda0d3b4eb3a257c9af1f8f03009"},
      {kKey, "bbaa99887766554433221102", k8, "",
       "81017f8203f081277152fade694a0a00"},
      {kKey, "bbaa99887766554433221103", "", k8,
       "45dd69f8f5aae72414054cd1f35d82760b2cd00d2f99bfa9"},
      {kKey, "bbaa99887766554433221104", k16, k16,
       "571d535b60b277188be5147170a9a22c3ad7a4ff3835b8c5701c1ccec8fc3358"},
      {kKey, "bbaa99887766554433221105", k16, "",
       "8cf761b6902ef764462ad86498ca6b97"},
      {kKey, "bbaa99887766554433221106", "", k16,
       "5ce88ec2e0692706a915c00aeb8b2396f40e1c743f52436bdf06d8fa1eca343d"},
      {kKey, "bbaa99887766554433221107", k24, k24,
       "1ca2207308c87c010756104d8840ce1952f09673a448a122"
       "c92c62241051f57356d7f3c90bb0e07f"},
      {kKey, "bbaa99887766554433221108", k24, "",
       "6dc225a071fc1b9f7c69f93b0f1e10de"},
      {kKey, "bbaa99887766554433221109", "", k24,
       "221bd0de7fa6fe993eccd769460a0af2d6cded0c395b1c3c"
       "e725f32494b9f914d85c0b1eb38357ff"},
      {kKey, "bbaa9988776655443322110a", k32, k32,
       "bd6f6c496201c69296c11efd138a467abd3c707924b964deaffc40319af5a485"
       "40fbba186c5553c68ad9f592a79a4240"},
      {kKey, "bbaa9988776655443322110b", k32, "",
       "fe80690bee8a485d11f32965bc9d2a32"},
      {kKey, "bbaa9988776655443322110c", "", k32,
       "2942bfc773bda23cabc6acfd9bfd5835bd300f0973792ef46040c53f1432bcdf"
       "b5e1dde3bc18a5f840b52e653444d5df"},
      {kKey, "bbaa9988776655443322110d", k40, k40,
       "d5ca91748410c1751ff8a2f618255b68a0a12e093ff454606e59f9c1d0ddc54b"
       "65e8628e568bad7aed07ba06a4a69483a7035490c5769e60"},
      {kKey, "bbaa9988776655443322110e", k40, "",
       "c5cd9d1850c141e358649994ee701b68"},
      {kKey, "bbaa9988776655443322110f", "", k40,
       "4412923493c57d5de0d700f753cce0d1d2d95060122e9f15a5ddbfc5787e50b5"
       "cc55ee507bcb084e479ad363ac366b95a98ca5f3000b1479"},
  };
  return kVectors;
}

namespace {

using Bytes = std::vector<uint8_t>;

Bytes FromHex(const char* hex) {
  const std::string raw = WireUnhex(hex);
  return Bytes(raw.begin(), raw.end());
}

// WireOcb's sealing of one unit (ciphertext, then the tag), the plaintext
// given in two pieces cut at `cut`.
Bytes OcbSeal(WireOcb& ocb, const Bytes& nonce, const Bytes& aad,
              const Bytes& plain, size_t cut) {
  Bytes out(plain.size() + WireOcb::kTagBytes);
  ocb.Begin(nonce.data(), aad.data(), aad.size(), out.data());
  ocb.Update(plain.data(), cut);
  ocb.Update(plain.data() + cut, plain.size() - cut);
  ocb.Finish();
  return out;
}

// Opens `sealed` (with its tag's last bit flipped when `alter`); the
// plaintext in `*plain` when it is authentic.
bool OcbOpen(WireOcb& ocb, const Bytes& nonce, const Bytes& aad,
             const Bytes& sealed, bool alter, Bytes* plain) {
  const size_t n = sealed.size() - WireOcb::kTagBytes;
  Bytes data = sealed;
  if (alter) data.back() ^= 1;
  if (!ocb.Open(nonce.data(), aad.data(), aad.size(), data.data(), n,
                data.data() + n)) {
    return false;
  }
  data.resize(n);
  *plain = std::move(data);
  return true;
}

// OpenSSL's EVP AES-128-OCB sealing of one unit (empty when it fails).
Bytes EvpSeal(const Bytes& key, const Bytes& nonce, const Bytes& aad,
              const Bytes& plain) {
  EVP_CIPHER_CTX* c = EVP_CIPHER_CTX_new();
  Bytes out(plain.size() + WireOcb::kTagBytes);
  int len = 0;
  int at = 0;
  bool ok = c != nullptr &&
            EVP_EncryptInit_ex(c, EVP_aes_128_ocb(), nullptr, key.data(),
                               nonce.data()) == 1 &&
            EVP_EncryptUpdate(c, nullptr, &len, aad.data(),
                              static_cast<int>(aad.size())) == 1 &&
            EVP_EncryptUpdate(c, out.data(), &at, plain.data(),
                              static_cast<int>(plain.size())) == 1 &&
            EVP_EncryptFinal_ex(c, out.data() + at, &len) == 1 &&
            static_cast<size_t>(at + len) == plain.size() &&
            EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_GET_TAG, WireOcb::kTagBytes,
                                out.data() + plain.size()) == 1;
  EVP_CIPHER_CTX_free(c);
  return ok ? out : Bytes();
}

absl::Status SelfTestFailed(absl::string_view what) {
  return absl::InternalError(
      absl::StrCat("WireOcb (vaes-512) failed its known-answer self-test: ",
                   what));
}

// The known answers in `vectors`: each sealed whole and cut in two, opened,
// and refused with an altered tag.
absl::Status CheckVectors(absl::Span<const WireOcbVector> vectors) {
  for (size_t i = 0; i < vectors.size(); ++i) {
    const WireOcbVector& v = vectors[i];
    const Bytes key = FromHex(v.key), nonce = FromHex(v.nonce);
    const Bytes aad = FromHex(v.aad), plain = FromHex(v.plain);
    const Bytes sealed = FromHex(v.sealed);
    const std::string name = absl::StrCat("vector ", i, " (nonce ", v.nonce, ")");
    if (key.size() != 16 || nonce.size() != WireOcb::kNonceBytes ||
        sealed.size() != plain.size() + WireOcb::kTagBytes) {
      return SelfTestFailed(absl::StrCat(name, ": malformed"));
    }
    WireOcb ocb(key.data());
    for (size_t cut : {plain.size(), plain.size() / 2}) {
      if (OcbSeal(ocb, nonce, aad, plain, cut) != sealed) {
        return SelfTestFailed(absl::StrCat(name, ": sealed wrong (cut at ",
                                           cut, ")"));
      }
    }
    Bytes opened;
    if (!OcbOpen(ocb, nonce, aad, sealed, false, &opened) || opened != plain) {
      return SelfTestFailed(absl::StrCat(name, ": did not open"));
    }
    if (OcbOpen(ocb, nonce, aad, sealed, true, &opened)) {
      return SelfTestFailed(absl::StrCat(name, ": opened an altered tag"));
    }
  }
  return absl::OkStatus();
}

// RFC 7253, Appendix A: K = zeros(15) || num2str(TAGLEN, 8); for i in
// 0..127, S = zeros(i), C ||= OCB(K, 3i+1, A = S, P = S) ||
// OCB(K, 3i+2, A = "", P = S) || OCB(K, 3i+3, A = S, P = ""); then
// OCB(K, 385, A = C, P = "").
absl::Status CheckIterated() {
  uint8_t key[16] = {};
  key[15] = 128;
  WireOcb ocb(key);
  auto nonce = [](uint64_t n) {
    Bytes b(WireOcb::kNonceBytes, 0);
    for (int j = 0; j < 8; ++j) b[11 - j] = static_cast<uint8_t>(n >> (8 * j));
    return b;
  };
  Bytes c;
  const Bytes none;
  for (uint64_t i = 0; i < 128; ++i) {
    const Bytes s(i, 0);
    for (const Bytes& part :
         {OcbSeal(ocb, nonce(3 * i + 1), s, s, s.size()),
          OcbSeal(ocb, nonce(3 * i + 2), none, s, s.size()),
          OcbSeal(ocb, nonce(3 * i + 3), s, none, 0)}) {
      c.insert(c.end(), part.begin(), part.end());
    }
  }
  if (OcbSeal(ocb, nonce(385), c, none, 0) !=
      FromHex("67e944d23256c5e0b6c61fa22fdf1ea2")) {
    return SelfTestFailed("RFC 7253's iterated test");
  }
  return absl::OkStatus();
}

// A unit long enough for the sixteen-block groups, against OpenSSL.
absl::Status CheckAgainstOpenSsl() {
  Bytes key(16), nonce(WireOcb::kNonceBytes), aad(13), plain(16 * 1024 + 7);
  for (size_t i = 0; i < key.size(); ++i) key[i] = static_cast<uint8_t>(0xa5 ^ i);
  for (size_t i = 0; i < nonce.size(); ++i) nonce[i] = static_cast<uint8_t>(3 * i + 1);
  for (size_t i = 0; i < aad.size(); ++i) aad[i] = static_cast<uint8_t>(7 * i);
  for (size_t i = 0; i < plain.size(); ++i) {
    plain[i] = static_cast<uint8_t>(i * 131 + (i >> 8));
  }
  const Bytes want = EvpSeal(key, nonce, aad, plain);
  WireOcb ocb(key.data());
  Bytes opened;
  if (want.empty() || OcbSeal(ocb, nonce, aad, plain, 4096 + 5) != want) {
    return SelfTestFailed("a 16 KiB unit is not what OpenSSL seals");
  }
  if (!OcbOpen(ocb, nonce, aad, want, false, &opened) || opened != plain) {
    return SelfTestFailed("a 16 KiB unit OpenSSL sealed did not open");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WireOcbSelfTest(absl::Span<const WireOcbVector> vectors) {
  if (!WireOcb::Supported()) {
    return absl::FailedPreconditionError(
        "WireOcb (vaes-512) needs a CPU with AES-NI, VAES, AVX-512F and "
        "AVX-512VL; this one lacks them");
  }
  absl::Status s = CheckVectors(vectors);
  if (s.ok()) s = CheckIterated();
  if (s.ok()) s = CheckAgainstOpenSsl();
  return s;
}

}  // namespace halka
