// WireOcb (worker/wire_ocb.h) against RFC 7253's vectors and OpenSSL's
// AES-128-OCB over lengths, splits, associated data and nonces: the two
// must write the same bytes, open each other's units, and refuse any
// altered one.
#include "worker/wire_ocb.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "worker/wire_seal.h"

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
      GTEST_SKIP() << "this CPU lacks VAES or AVX-512, so wire links seal "
                      "with OpenSSL's OCB and WireOcb is not used";
    }
  }
};

TEST_F(WireOcbTest, MatchesTheRfc7253Vectors) {
  const Bytes key = Hex("000102030405060708090a0b0c0d0e0f");
  WireOcb ocb(key.data());
  struct Vector {
    const char* nonce;
    const char* aad;
    const char* plain;
    const char* sealed;
  };
  const Vector vectors[] = {
      {"bbaa99887766554433221100", "", "", "785407bfffc8ad9edcc5520ac9111ee6"},
      {"bbaa99887766554433221101", "0001020304050607", "0001020304050607",
       "6820b3657b6f615a5725bda0d3b4eb3a257c9af1f8f03009"},
  };
  for (const Vector& v : vectors) {
    const Bytes nonce = Hex(v.nonce), aad = Hex(v.aad), plain = Hex(v.plain);
    const Bytes want = Hex(v.sealed);
    EXPECT_EQ(OursSeal(ocb, nonce, aad, plain), want) << v.nonce;
    EXPECT_EQ(OpenSslSeal(key, nonce, aad, plain), want) << v.nonce;
    Bytes data = want;
    ASSERT_TRUE(ocb.Open(nonce.data(), aad.data(), aad.size(), data.data(),
                         plain.size(), want.data() + plain.size()));
    data.resize(plain.size());
    EXPECT_EQ(data, plain);
  }
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
