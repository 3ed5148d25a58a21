// WireSeal (seal/wire_seal.h) with each engine: OpenSSL's by default and
// everywhere, vaes-512 only where the CPU has it and its self-test passes;
// every cut of a unit into pieces gives the one-piece bytes, both engines
// open each other's units in one process, and keys are wiped.
#include "seal/wire_seal.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "seal/wire_ocb.h"

namespace halka {
namespace {

using Bytes = std::vector<uint8_t>;
using Parts = std::vector<absl::Span<const uint8_t>>;

Bytes Pattern(size_t n, uint8_t seed) {
  Bytes b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(seed + i * 131 + (i >> 9));
  return b;
}

std::string Key() {
  std::string key(WireSeal::kKeyBytes, '\0');
  for (size_t i = 0; i < key.size(); ++i) key[i] = static_cast<char>(0x3c ^ (i * 17));
  return key;
}

TEST(WireSealEngine, NamesParseAndOpenSslIsTheDefault) {
  EXPECT_STREQ(WireSealEngineName(WireSealEngine::kOpenSsl), "openssl");
  EXPECT_STREQ(WireSealEngineName(WireSealEngine::kVaes512), "vaes-512");
  EXPECT_EQ(*ParseWireSealEngine("openssl"), WireSealEngine::kOpenSsl);
  EXPECT_EQ(*ParseWireSealEngine("vaes-512"), WireSealEngine::kVaes512);
  EXPECT_EQ(ParseWireSealEngine("vaes").status().code(),
            absl::StatusCode::kInvalidArgument);
  // This test runs without HALKA_WIRE_OCB: standard crypto by default,
  // whatever the CPU.
  ASSERT_EQ(std::getenv("HALKA_WIRE_OCB"), nullptr);
  EXPECT_EQ(WireSeal::DefaultEngine(), WireSealEngine::kOpenSsl);
  EXPECT_STREQ(WireSeal::Engine(), "openssl");
  WireSeal seal(Key());
  EXPECT_EQ(seal.engine(), WireSealEngine::kOpenSsl);
  EXPECT_TRUE(WireSeal::CheckEngine(WireSealEngine::kOpenSsl).ok());
}

TEST(WireSealEngine, Vaes512IsRefusedWhereTheCpuLacksIt) {
  if (WireOcb::Supported()) GTEST_SKIP() << "this CPU has VAES-512";
  const absl::Status s = WireSeal::CheckEngine(WireSealEngine::kVaes512);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("lacks"), absl::string_view::npos) << s;
  EXPECT_EQ(WireSeal::SetDefaultEngine(WireSealEngine::kVaes512).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(WireSeal::DefaultEngine(), WireSealEngine::kOpenSsl);
}

TEST(WireSealEngine, Vaes512IsTakenOnlyAfterItsSelfTest) {
  if (!WireOcb::Supported()) {
    GTEST_SKIP() << "this CPU lacks VAES or AVX-512F/VL: no vaes-512 engine";
  }
  ASSERT_TRUE(WireOcbSelfTest().ok());
  ASSERT_TRUE(WireSeal::CheckEngine(WireSealEngine::kVaes512).ok());
  ASSERT_TRUE(WireSeal::SetDefaultEngine(WireSealEngine::kVaes512).ok());
  EXPECT_STREQ(WireSeal::Engine(), "vaes-512");
  EXPECT_EQ(WireSeal(Key()).engine(), WireSealEngine::kVaes512);
  ASSERT_TRUE(WireSeal::SetDefaultEngine(WireSealEngine::kOpenSsl).ok());
  EXPECT_EQ(WireSeal(Key()).engine(), WireSealEngine::kOpenSsl);
}

class WireSealByEngine : public ::testing::TestWithParam<WireSealEngine> {
 protected:
  void SetUp() override {
    const absl::Status s = WireSeal::CheckEngine(GetParam());
    if (!s.ok()) GTEST_SKIP() << s.message();
  }
};

// The first unit of a connection is OCB with nonce 0: OpenSSL's EVP,
// called directly, writes the same bytes.
TEST_P(WireSealByEngine, FirstUnitIsOcbWithNonceZero) {
  const std::string key = Key();
  const Bytes plain = Pattern(1000, 3), aad = {9, 8, 7};
  WireSeal seal(key, GetParam());
  Bytes got(plain.size() + WireSeal::kTagBytes);
  ASSERT_TRUE(seal.Seal(Parts{plain}, aad, got.data()).ok());

  Bytes want(plain.size() + 16);
  const uint8_t nonce[12] = {};
  EVP_CIPHER_CTX* c = EVP_CIPHER_CTX_new();
  int len = 0, tail = 0;
  ASSERT_EQ(EVP_EncryptInit_ex(c, EVP_aes_128_ocb(), nullptr,
                               reinterpret_cast<const uint8_t*>(key.data()),
                               nonce),
            1);
  ASSERT_EQ(EVP_EncryptUpdate(c, nullptr, &len, aad.data(), 3), 1);
  ASSERT_EQ(EVP_EncryptUpdate(c, want.data(), &len, plain.data(), 1000), 1);
  ASSERT_EQ(EVP_EncryptFinal_ex(c, want.data() + len, &tail), 1);
  ASSERT_EQ(EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_GET_TAG, 16, want.data() + 1000), 1);
  EVP_CIPHER_CTX_free(c);
  EXPECT_EQ(got, want);
}

// A 4109-byte unit cut in two at every k in 0..4096 (and in three) seals
// to the one-piece bytes, which open back; an altered one does not.
TEST_P(WireSealByEngine, EveryCutSealsTheSameUnit) {
  const std::string key = Key();
  const Bytes plain = Pattern(4096 + 13, 1), aad = Pattern(24, 77);
  Bytes want(plain.size() + WireSeal::kTagBytes);
  {
    WireSeal one(key, GetParam());
    ASSERT_TRUE(one.Seal(Parts{plain}, aad, want.data()).ok());
  }
  const absl::Span<const uint8_t> all(plain);
  Bytes got(want.size());
  for (size_t k = 0; k <= 4096; ++k) {
    const size_t m = std::min(plain.size(), k + 1 + (k * 7) % 61);
    const Parts cuts[] = {
        {all.subspan(0, k), all.subspan(k)},
        {all.subspan(0, k), all.subspan(k, m - k), all.subspan(m)},
    };
    for (const Parts& parts : cuts) {
      WireSeal tx(key, GetParam());
      ASSERT_TRUE(tx.Seal(parts, aad, got.data()).ok());
      ASSERT_EQ(got, want) << "cut at " << k << " in " << parts.size();
    }
    WireSeal rx(key, GetParam());
    ASSERT_TRUE(rx.Open(got.data(), plain.size(), aad).ok()) << k;
    ASSERT_TRUE(std::equal(plain.begin(), plain.end(), got.begin())) << k;
  }
  Bytes altered = want;
  altered[4096] ^= 0x40;
  WireSeal rx(key, GetParam());
  EXPECT_EQ(rx.Open(altered.data(), plain.size(), aad).code(),
            absl::StatusCode::kDataLoss);
}

INSTANTIATE_TEST_SUITE_P(Engines, WireSealByEngine,
                         ::testing::Values(WireSealEngine::kOpenSsl,
                                           WireSealEngine::kVaes512),
                         [](const auto& info) {
                           return info.param == WireSealEngine::kOpenSsl
                                      ? "openssl"
                                      : "vaes512";
                         });

// One process, both engines: each opens what the other seals, unit after
// unit (the nonces advance alike), and writes the same bytes.
TEST(WireSealEngines, OpenEachOthersUnits) {
  const absl::Status vaes = WireSeal::CheckEngine(WireSealEngine::kVaes512);
  if (!vaes.ok()) GTEST_SKIP() << vaes.message();
  const std::string key = Key();
  for (const bool vaes_seals : {true, false}) {
    WireSeal tx(key, vaes_seals ? WireSealEngine::kVaes512 : WireSealEngine::kOpenSsl);
    WireSeal same(key, vaes_seals ? WireSealEngine::kOpenSsl : WireSealEngine::kVaes512);
    WireSeal rx(key, vaes_seals ? WireSealEngine::kOpenSsl : WireSealEngine::kVaes512);
    for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{255},
                     size_t{256}, size_t{4096 + 9}, size_t{(1 << 20) + 3}}) {
      const Bytes plain = Pattern(n, static_cast<uint8_t>(n)), aad = Pattern(n % 37, 5);
      const absl::Span<const uint8_t> all(plain);
      Bytes a(n + WireSeal::kTagBytes), b(n + WireSeal::kTagBytes);
      ASSERT_TRUE(tx.Seal(Parts{all.subspan(0, n / 3), all.subspan(n / 3)}, aad, a.data()).ok());
      ASSERT_TRUE(same.Seal(Parts{all}, aad, b.data()).ok());
      ASSERT_EQ(a, b) << n;
      ASSERT_TRUE(rx.Open(a.data(), n, aad).ok()) << n;
      ASSERT_TRUE(std::equal(plain.begin(), plain.end(), a.begin())) << n;
    }
  }
}

TEST(WipeKey, OverwritesTheBufferAndEmpties) {
  std::string key = Key() + Key();  // on the heap
  const char* buffer = key.data();
  const size_t n = key.size();
  WipeKey(&key);
  EXPECT_TRUE(key.empty());
  ASSERT_EQ(key.data(), buffer);  // still its buffer (clear keeps it)
  EXPECT_EQ(std::count(buffer, buffer + n, '\0'), static_cast<std::ptrdiff_t>(n));
}

TEST(WipedKey, CopiesKeepMovesEmptyTheSource) {
  WipedKey a(Key());
  WipedKey b = a;
  EXPECT_EQ(b.str(), Key());
  WipedKey c = std::move(a);
  EXPECT_EQ(c.str(), Key());
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move): wiped
  b = WipedKey();
  EXPECT_TRUE(b.empty());
  c = b;
  EXPECT_TRUE(c.empty());
}

}  // namespace
}  // namespace halka
