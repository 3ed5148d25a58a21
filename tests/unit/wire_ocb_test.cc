// RFC 7253's AES-128-OCB known answers through OpenSSL's EVP (always) and
// WireOcb (seal/wire_ocb.h, where the CPU has VAES-512), WireOcb against
// OpenSSL over lengths, every cut of a unit in two, associated data and
// nonces (the two must write the same bytes, open each other's units, and
// refuse any altered one), and WireOcb's start-up self-test.
#include "seal/wire_ocb.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>

#include "absl/status/status.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "seal/wire_seal.h"

namespace halka {
namespace {

using Bytes = std::vector<uint8_t>;

Bytes Hex(const std::string& hex) {
  const std::string raw = WireUnhex(hex);
  return Bytes(raw.begin(), raw.end());
}

// OpenSSL's sealing of one unit: ciphertext, then the tag.
Bytes OpenSslSeal(const Bytes& key, const Bytes& nonce, const Bytes& aad,
                  const Bytes& plain) {
  EVP_CIPHER_CTX* c = EVP_CIPHER_CTX_new();
  Bytes out(plain.size() + 16);
  int len = 0, at = 0;
  EXPECT_EQ(EVP_EncryptInit_ex(c, EVP_aes_128_ocb(), nullptr, key.data(),
                               nonce.data()),
            1);
  if (!aad.empty()) {
    EXPECT_EQ(EVP_EncryptUpdate(c, nullptr, &len, aad.data(),
                                static_cast<int>(aad.size())),
              1);
  }
  if (!plain.empty()) {
    EXPECT_EQ(EVP_EncryptUpdate(c, out.data(), &len, plain.data(),
                                static_cast<int>(plain.size())),
              1);
    at = len;
  }
  EXPECT_EQ(EVP_EncryptFinal_ex(c, out.data() + at, &len), 1);
  at += len;
  EXPECT_EQ(static_cast<size_t>(at), plain.size());
  EXPECT_EQ(EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_GET_TAG, 16, out.data() + at),
            1);
  EVP_CIPHER_CTX_free(c);
  return out;
}

// OpenSSL's opening of one unit (ciphertext, then the tag); false when it
// is not authentic.
bool OpenSslOpen(const Bytes& key, const Bytes& nonce, const Bytes& aad,
                 const Bytes& sealed, Bytes* plain) {
  const size_t n = sealed.size() - 16;
  Bytes tag(sealed.begin() + static_cast<std::ptrdiff_t>(n), sealed.end());
  EVP_CIPHER_CTX* c = EVP_CIPHER_CTX_new();
  plain->assign(n + 16, 0);
  int len = 0, at = 0;
  bool ok = EVP_DecryptInit_ex(c, EVP_aes_128_ocb(), nullptr, key.data(),
                               nonce.data()) == 1;
  if (ok && !aad.empty()) {
    ok = EVP_DecryptUpdate(c, nullptr, &len, aad.data(),
                           static_cast<int>(aad.size())) == 1;
  }
  if (ok && n > 0) {
    ok = EVP_DecryptUpdate(c, plain->data(), &len, sealed.data(),
                           static_cast<int>(n)) == 1;
    at = len;
  }
  ok = ok && EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_SET_TAG, 16, tag.data()) == 1 &&
       EVP_DecryptFinal_ex(c, plain->data() + at, &len) == 1;
  EVP_CIPHER_CTX_free(c);
  plain->resize(n);
  return ok;
}

// RFC 7253's iterated test (Appendix A) with `seal` as OCB-ENCRYPT(K, N, A,
// P): the tag it ends with.
template <typename Seal>
Bytes Rfc7253Iterated(Seal seal) {
  Bytes key(16, 0);
  key[15] = 128;  // TAGLEN
  auto nonce = [](uint64_t n) {
    Bytes b(12, 0);
    for (int j = 0; j < 8; ++j) b[11 - j] = static_cast<uint8_t>(n >> (8 * j));
    return b;
  };
  Bytes c;
  const Bytes none;
  for (uint64_t i = 0; i < 128; ++i) {
    const Bytes s(i, 0);
    for (const Bytes& part : {seal(key, nonce(3 * i + 1), s, s),
                              seal(key, nonce(3 * i + 2), none, s),
                              seal(key, nonce(3 * i + 3), s, none)}) {
      c.insert(c.end(), part.begin(), part.end());
    }
  }
  return seal(key, nonce(385), c, none);
}

// RFC 7253, Appendix A: "the result of the iterated test for AES-128, TAGLEN 128".
constexpr char kIteratedTag[] = "67e944d23256c5e0b6c61fa22fdf1ea2";

TEST(Rfc7253, EverySampleThroughOpenSsl) {
  const auto vectors = WireOcbRfc7253Vectors();
  // Appendix A's sixteen: associated data and plaintext of 0-40 bytes.
  ASSERT_EQ(vectors.size(), 16u);
  for (const WireOcbVector& v : vectors) {
    const Bytes key = Hex(v.key), nonce = Hex(v.nonce), aad = Hex(v.aad);
    const Bytes plain = Hex(v.plain), want = Hex(v.sealed);
    ASSERT_EQ(want.size(), plain.size() + 16) << v.nonce;
    EXPECT_EQ(OpenSslSeal(key, nonce, aad, plain), want) << v.nonce;
    Bytes opened;
    EXPECT_TRUE(OpenSslOpen(key, nonce, aad, want, &opened)) << v.nonce;
    EXPECT_EQ(opened, plain) << v.nonce;
    Bytes altered = want;
    altered.back() ^= 1;
    EXPECT_FALSE(OpenSslOpen(key, nonce, aad, altered, &opened)) << v.nonce;
  }
}

TEST(Rfc7253, IteratedTestThroughOpenSsl) {
  EXPECT_EQ(Rfc7253Iterated(OpenSslSeal), Hex(kIteratedTag));
}

TEST(WireOcbSelfTest, RefusesWhereTheCpuLacksVaes512) {
  if (WireOcb::Supported()) GTEST_SKIP() << "this CPU has VAES-512";
  EXPECT_EQ(WireOcbSelfTest().code(), absl::StatusCode::kFailedPrecondition);
}

// Seals with WireOcb, the plaintext given in the pieces `cuts` make.
Bytes OursSeal(WireOcb& ocb, const Bytes& nonce, const Bytes& aad,
               const Bytes& plain, const std::vector<size_t>& cuts = {}) {
  Bytes out(plain.size() + 16);
  ocb.Begin(nonce.data(), aad.data(), aad.size(), out.data());
  size_t at = 0;
  for (size_t cut : cuts) {
    ocb.Update(plain.data() + at, cut - at);
    at = cut;
  }
  ocb.Update(plain.data() + at, plain.size() - at);
  ocb.Finish();
  return out;
}

class WireOcbTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!WireOcb::Supported()) {
      GTEST_SKIP() << "this CPU lacks VAES or AVX-512F/VL: WireOcb (the "
                      "opt-in vaes-512 engine) cannot run here";
    }
  }
};

TEST_F(WireOcbTest, MatchesEveryRfc7253Sample) {
  for (const WireOcbVector& v : WireOcbRfc7253Vectors()) {
    const Bytes key = Hex(v.key);
    WireOcb ocb(key.data());
    const Bytes nonce = Hex(v.nonce), aad = Hex(v.aad), plain = Hex(v.plain);
    const Bytes want = Hex(v.sealed);
    EXPECT_EQ(OursSeal(ocb, nonce, aad, plain), want) << v.nonce;
    Bytes data = want;
    ASSERT_TRUE(ocb.Open(nonce.data(), aad.data(), aad.size(), data.data(),
                         plain.size(), want.data() + plain.size()))
        << v.nonce;
    data.resize(plain.size());
    EXPECT_EQ(data, plain);
  }
}

TEST_F(WireOcbTest, PassesRfc7253sIteratedTest) {
  auto seal = [](const Bytes& key, const Bytes& nonce, const Bytes& aad,
                 const Bytes& plain) {
    WireOcb ocb(key.data());
    return OursSeal(ocb, nonce, aad, plain);
  };
  EXPECT_EQ(Rfc7253Iterated(seal), Hex(kIteratedTag));
}

TEST_F(WireOcbTest, SelfTestPassesAndCatchesAWrongAnswer) {
  EXPECT_TRUE(WireOcbSelfTest().ok()) << WireOcbSelfTest();
  // Each sample in turn with one hex digit of its expected bytes changed
  // (the first: ciphertext, or the tag where there is none; then the
  // tag's last): the self-test fails and names it.
  const auto rfc = WireOcbRfc7253Vectors();
  for (size_t i = 0; i < 2 * rfc.size(); ++i) {
    std::vector<WireOcbVector> vectors(rfc.begin(), rfc.end());
    std::string sealed = vectors[i / 2].sealed;
    char& digit = i % 2 == 0 ? sealed.front() : sealed.back();
    digit = digit == '0' ? '1' : '0';
    vectors[i / 2].sealed = sealed.c_str();
    const absl::Status s = WireOcbSelfTest(vectors);
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << i;
    EXPECT_NE(s.message().find("vector " + std::to_string(i / 2) + " "),
              absl::string_view::npos)
        << s;
  }
}

// Every cut of a 4109-byte unit in two (0..4096), and in three, gives the
// one-piece bytes (OpenSSL's), which open back.
TEST_F(WireOcbTest, EveryCutGivesTheSameUnit) {
  Bytes key(16), nonce(12, 7), aad(21), plain(4096 + 13);
  for (size_t i = 0; i < key.size(); ++i) key[i] = static_cast<uint8_t>(i * 29);
  for (size_t i = 0; i < aad.size(); ++i) aad[i] = static_cast<uint8_t>(i);
  for (size_t i = 0; i < plain.size(); ++i) plain[i] = static_cast<uint8_t>(i * 131 + 5);
  const Bytes want = OpenSslSeal(key, nonce, aad, plain);
  WireOcb ocb(key.data());
  for (size_t k = 0; k <= 4096; ++k) {
    ASSERT_EQ(OursSeal(ocb, nonce, aad, plain, {k}), want) << "cut at " << k;
    const size_t m = std::min(plain.size(), k + 1 + (k * 7) % 61);
    ASSERT_EQ(OursSeal(ocb, nonce, aad, plain, {k, m}), want)
        << "cuts at " << k << ", " << m;
  }
  Bytes data = want;
  ASSERT_TRUE(ocb.Open(nonce.data(), aad.data(), aad.size(), data.data(),
                       plain.size(), want.data() + plain.size()));
  data.resize(plain.size());
  EXPECT_EQ(data, plain);
}

TEST_F(WireOcbTest, WritesWhatOpenSslWritesAndOpensIt) {
  std::mt19937_64 rng(7253);
  auto random_bytes = [&](size_t n) {
    Bytes b(n);
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    return b;
  };
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 600; ++n) lengths.push_back(n);
  // Around the sixteen-block groups, and units as large as wire chunks.
  for (size_t n : {255, 256, 257, 511, 512, 4096, 4111, 65536 + 7,
                   (1 << 20) + 13, (4 << 20)}) {
    lengths.push_back(n);
  }
  int checked = 0;
  for (size_t n : lengths) {
    const Bytes key = random_bytes(16);
    WireOcb ocb(key.data());
    Bytes nonce = random_bytes(12);
    // The nonce's last six bits pick OCB's stretch shift: every one.
    nonce[11] = static_cast<uint8_t>(n);
    const Bytes aad = random_bytes(rng() % 41);
    const Bytes plain = random_bytes(n);
    std::vector<size_t> cuts;
    for (int k = static_cast<int>(rng() % 4); k > 0 && n > 0; --k) {
      cuts.push_back(rng() % (n + 1));
    }
    std::sort(cuts.begin(), cuts.end());
    const Bytes want = OpenSslSeal(key, nonce, aad, plain);
    const Bytes got = OursSeal(ocb, nonce, aad, plain, cuts);
    ASSERT_EQ(got, want) << "length " << n << ", " << cuts.size() << " cuts";
    Bytes data = want;
    ASSERT_TRUE(ocb.Open(nonce.data(), aad.data(), aad.size(), data.data(), n,
                         want.data() + n))
        << "length " << n;
    ASSERT_TRUE(std::equal(plain.begin(), plain.end(), data.begin()))
        << "length " << n;
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(lengths.size()));
}

TEST_F(WireOcbTest, RefusesAnyAlteredUnit) {
  std::mt19937_64 rng(11);
  const Bytes key(16, 0x5a);
  WireOcb ocb(key.data());
  const Bytes nonce(12, 3), aad = {1, 2, 3, 4, 5, 6, 7, 8};
  for (size_t n : {0, 5, 16, 300, 4096 + 9}) {
    Bytes plain(n);
    for (auto& x : plain) x = static_cast<uint8_t>(rng());
    const Bytes sealed = OursSeal(ocb, nonce, aad, plain);
    auto opens = [&](Bytes s, const Bytes& nn, const Bytes& a) {
      return ocb.Open(nn.data(), a.data(), a.size(), s.data(), n,
                      s.data() + n);
    };
    EXPECT_TRUE(opens(sealed, nonce, aad)) << n;
    // One bit flipped anywhere in the ciphertext or the tag.
    for (size_t at : {size_t{0}, n / 2, n, n + 15}) {
      if (at >= sealed.size()) continue;
      Bytes s = sealed;
      s[at] ^= 0x10;
      EXPECT_FALSE(opens(s, nonce, aad)) << n << " at " << at;
    }
    Bytes other_nonce = nonce;
    other_nonce[11] ^= 1;
    EXPECT_FALSE(opens(sealed, other_nonce, aad)) << n;
    Bytes other_aad = aad;
    other_aad[0] ^= 1;
    EXPECT_FALSE(opens(sealed, nonce, other_aad)) << n;
  }
}

}  // namespace
}  // namespace halka
