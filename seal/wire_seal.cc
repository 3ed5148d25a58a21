#include "seal/wire_seal.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "seal/wire_ocb.h"

namespace halka {

std::string WireHex(absl::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

std::string WireUnhex(absl::string_view hex) {
  auto value = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (hex.size() % 2 != 0) return "";
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2) {
    const int hi = value(hex[i]);
    const int lo = value(hex[i + 1]);
    if (hi < 0 || lo < 0) return "";
    out.push_back(static_cast<char>(hi * 16 + lo));
  }
  return out;
}

absl::StatusOr<std::string> WireRandomBytes(size_t n) {
  std::string bytes(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(bytes.data()),
                 static_cast<int>(bytes.size())) != 1) {
    return absl::InternalError("RAND_bytes failed: no key or token for a wire link");
  }
  return bytes;
}

namespace {

absl::Status NotAuthentic() {
  return absl::DataLossError(
      "a wire record failed authentication (AES-OCB tag): "
      "altered, replayed or out of order");
}

}  // namespace

absl::StatusOr<std::string> WireSeal::NewKey() {
  return WireRandomBytes(kKeyBytes);
}

const char* WireSealEngineName(WireSealEngine engine) {
  return engine == WireSealEngine::kVaes512 ? "vaes-512" : "openssl";
}

absl::StatusOr<WireSealEngine> ParseWireSealEngine(absl::string_view name) {
  if (name == "openssl") return WireSealEngine::kOpenSsl;
  if (name == "vaes-512") return WireSealEngine::kVaes512;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown wire sealing engine '", name, "' (openssl or vaes-512)"));
}

void WipeKey(std::string* key) {
  // The whole buffer, not just size(): a moved-from or shortened string
  // may still hold key bytes past its end.
  key->resize(key->capacity());
  OPENSSL_cleanse(key->data(), key->size());
  key->clear();
}

namespace {

// The process's engine (WireSealEngine's value); -1 until picked.
std::atomic<int> g_default_engine{-1};

WireSealEngine EngineFromEnvironment() {
  const char* pick = std::getenv("HALKA_WIRE_OCB");
  if (pick == nullptr || *pick == '\0') return WireSealEngine::kOpenSsl;
  absl::StatusOr<WireSealEngine> engine = ParseWireSealEngine(pick);
  const absl::Status usable =
      engine.ok() ? WireSeal::CheckEngine(*engine) : engine.status();
  if (!usable.ok()) {
    // Refused, not replaced: the environment asked for this engine.
    std::fprintf(stderr, "HALKA_WIRE_OCB=%s: %s\n", pick,
                 std::string(usable.message()).c_str());
    std::exit(2);
  }
  return *engine;
}

}  // namespace

WireSealEngine WireSeal::DefaultEngine() {
  int engine = g_default_engine.load(std::memory_order_acquire);
  if (engine < 0) {
    static const WireSealEngine from_environment = EngineFromEnvironment();
    int unset = -1;
    g_default_engine.compare_exchange_strong(
        unset, static_cast<int>(from_environment), std::memory_order_acq_rel);
    engine = g_default_engine.load(std::memory_order_acquire);
  }
  return static_cast<WireSealEngine>(engine);
}

absl::Status WireSeal::CheckEngine(WireSealEngine engine) {
  if (engine == WireSealEngine::kOpenSsl) return absl::OkStatus();
  if (!WireOcb::Supported()) {
    return absl::FailedPreconditionError(
        "the vaes-512 wire sealing engine needs a CPU with AES-NI, VAES, "
        "AVX-512F and AVX-512VL, and this one lacks them (use openssl)");
  }
  static const absl::Status* const self_test =
      new absl::Status(WireOcbSelfTest());
  if (!self_test->ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the vaes-512 wire sealing engine is refused: ",
        self_test->message()));
  }
  return absl::OkStatus();
}

absl::Status WireSeal::SetDefaultEngine(WireSealEngine engine) {
  absl::Status usable = CheckEngine(engine);
  if (!usable.ok()) return usable;
  g_default_engine.store(static_cast<int>(engine), std::memory_order_release);
  return absl::OkStatus();
}

WireSeal::WireSeal(std::string key, WireSealEngine engine)
    : key_(std::move(key)) {
  if (engine == WireSealEngine::kVaes512 && key_.size() == kKeyBytes) {
    const absl::Status usable = CheckEngine(engine);
    if (!usable.ok()) {  // a caller's bug: CheckEngine first
      std::fprintf(stderr, "WireSeal: %s\n",
                   std::string(usable.message()).c_str());
      std::abort();
    }
    fast_ = std::make_unique<WireOcb>(
        reinterpret_cast<const uint8_t*>(key_.data()));
  }
}

WireSeal::~WireSeal() {
  EVP_CIPHER_CTX_free(static_cast<EVP_CIPHER_CTX*>(seal_ctx_));
  EVP_CIPHER_CTX_free(static_cast<EVP_CIPHER_CTX*>(open_ctx_));
  WipeKey(&key_);
}

void* WireSeal::Ctx(bool seal) {
  void*& slot = seal ? seal_ctx_ : open_ctx_;
  if (slot != nullptr || key_.size() != kKeyBytes) return slot;
  EVP_CIPHER_CTX* c = EVP_CIPHER_CTX_new();
  const auto* key = reinterpret_cast<const unsigned char*>(key_.data());
  // The key once; each unit sets only its nonce (12 bytes, OCB's default).
  const bool ok =
      c != nullptr &&
      (seal ? EVP_EncryptInit_ex(c, EVP_aes_128_ocb(), nullptr, key, nullptr)
            : EVP_DecryptInit_ex(c, EVP_aes_128_ocb(), nullptr, key, nullptr)) ==
          1;
  if (!ok) {
    EVP_CIPHER_CTX_free(c);
    return nullptr;
  }
  slot = c;
  return slot;
}

void WireSeal::NextNonce(uint8_t nonce[12]) {
  std::memset(nonce, 0, 4);
  const uint64_t c = counter_++;
  for (int i = 0; i < 8; ++i) nonce[4 + i] = static_cast<uint8_t>(c >> (8 * i));
}

absl::Status WireSeal::Seal(absl::Span<const absl::Span<const uint8_t>> parts,
                            absl::Span<const uint8_t> aad, uint8_t* out) {
  uint8_t nonce[12];
  NextNonce(nonce);
  if (fast_ != nullptr) {
    fast_->Begin(nonce, aad.data(), aad.size(), out);
    for (const auto& p : parts) fast_->Update(p.data(), p.size());
    fast_->Finish();
    return absl::OkStatus();
  }
  auto* c = static_cast<EVP_CIPHER_CTX*>(Ctx(true));
  int len = 0;
  bool ok = c != nullptr &&
            EVP_EncryptInit_ex(c, nullptr, nullptr, nullptr, nonce) == 1 &&
            EVP_EncryptUpdate(c, nullptr, &len, aad.data(),
                              static_cast<int>(aad.size())) == 1;
  // OCB holds back a partial block until the next part or Final: `at`
  // counts what came out.
  size_t at = 0;
  for (const auto& p : parts) {
    if (!ok) break;
    if (p.empty()) continue;
    // EVP takes int lengths: frames are far below 2 GiB (kMaxRecordBytes).
    ok = EVP_EncryptUpdate(c, out + at, &len, p.data(),
                           static_cast<int>(p.size())) == 1;
    at += static_cast<size_t>(len);
  }
  ok = ok && EVP_EncryptFinal_ex(c, out + at, &len) == 1;
  at += ok ? static_cast<size_t>(len) : 0;
  ok = ok && EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_GET_TAG, kTagBytes,
                                 out + at) == 1;
  return ok ? absl::OkStatus()
            : absl::InternalError("AES-OCB failed to seal a wire record");
}

absl::Status WireSeal::Open(uint8_t* data, size_t n,
                            absl::Span<const uint8_t> aad,
                            const uint8_t* tag) {
  uint8_t nonce[12];
  NextNonce(nonce);
  uint8_t want[kTagBytes];
  std::memcpy(want, tag != nullptr ? tag : data + n, kTagBytes);
  if (fast_ != nullptr) {
    return fast_->Open(nonce, aad.data(), aad.size(), data, n, want)
               ? absl::OkStatus()
               : NotAuthentic();
  }
  auto* c = static_cast<EVP_CIPHER_CTX*>(Ctx(false));
  int len = 0;
  int tail = 0;
  // In place: OCB holds back a trailing partial block, which Final writes
  // where it belongs.
  const bool ok =
      c != nullptr &&
      EVP_DecryptInit_ex(c, nullptr, nullptr, nullptr, nonce) == 1 &&
      EVP_DecryptUpdate(c, nullptr, &len, aad.data(),
                        static_cast<int>(aad.size())) == 1 &&
      (n == 0 ||
       EVP_DecryptUpdate(c, data, &len, data, static_cast<int>(n)) == 1) &&
      EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_SET_TAG, kTagBytes, want) == 1 &&
      EVP_DecryptFinal_ex(c, data + (n == 0 ? 0 : len), &tail) == 1;
  return ok ? absl::OkStatus() : NotAuthentic();
}

}  // namespace halka
