#include "worker/wire_seal.h"

#include <openssl/evp.h>
#include <openssl/rand.h>

#include <cstring>
#include <utility>

namespace halka {
namespace {

EVP_CIPHER_CTX* Ctx(void* p) { return static_cast<EVP_CIPHER_CTX*>(p); }

}  // namespace

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

absl::StatusOr<std::string> WireSeal::NewKey() {
  return WireRandomBytes(kKeyBytes);
}

WireSeal::WireSeal(std::string key)
    : key_(std::move(key)), ctx_(EVP_CIPHER_CTX_new()) {}

WireSeal::~WireSeal() { EVP_CIPHER_CTX_free(Ctx(ctx_)); }

void WireSeal::NextNonce(uint8_t nonce[12]) {
  std::memset(nonce, 0, 4);
  const uint64_t c = counter_++;
  for (int i = 0; i < 8; ++i) nonce[4 + i] = static_cast<uint8_t>(c >> (8 * i));
}

absl::Status WireSeal::Seal(absl::Span<const absl::Span<const uint8_t>> parts,
                            absl::Span<const uint8_t> aad, uint8_t* out) {
  uint8_t nonce[12];
  NextNonce(nonce);
  EVP_CIPHER_CTX* c = Ctx(ctx_);
  const auto* key = reinterpret_cast<const unsigned char*>(key_.data());
  int len = 0;
  bool ok = c != nullptr && key_.size() == kKeyBytes &&
            EVP_EncryptInit_ex(c, EVP_aes_128_gcm(), nullptr, key, nonce) == 1 &&
            EVP_EncryptUpdate(c, nullptr, &len, aad.data(),
                              static_cast<int>(aad.size())) == 1;
  size_t at = 0;
  for (const auto& p : parts) {
    if (!ok) break;
    // EVP takes int lengths: frames are far below 2 GiB (kMaxRecordBytes).
    ok = EVP_EncryptUpdate(c, out + at, &len, p.data(),
                           static_cast<int>(p.size())) == 1;
    at += static_cast<size_t>(len);
  }
  ok = ok && EVP_EncryptFinal_ex(c, out + at, &len) == 1;
  at += ok ? static_cast<size_t>(len) : 0;
  ok = ok && EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, kTagBytes,
                                 out + at) == 1;
  return ok ? absl::OkStatus()
            : absl::InternalError("AES-GCM failed to seal a wire record");
}

absl::Status WireSeal::OpenBegin(absl::Span<const uint8_t> aad) {
  uint8_t nonce[12];
  NextNonce(nonce);
  EVP_CIPHER_CTX* c = Ctx(ctx_);
  const auto* key = reinterpret_cast<const unsigned char*>(key_.data());
  int len = 0;
  const bool ok =
      c != nullptr && key_.size() == kKeyBytes &&
      EVP_DecryptInit_ex(c, EVP_aes_128_gcm(), nullptr, key, nonce) == 1 &&
      EVP_DecryptUpdate(c, nullptr, &len, aad.data(),
                        static_cast<int>(aad.size())) == 1;
  return ok ? absl::OkStatus()
            : absl::InternalError("AES-GCM failed to start opening a record");
}

absl::Status WireSeal::OpenPart(uint8_t* data, size_t n) {
  if (n == 0) return absl::OkStatus();
  int len = 0;
  // GCM is a stream cipher: each part comes out whole and in place.
  const bool ok = EVP_DecryptUpdate(Ctx(ctx_), data, &len, data,
                                    static_cast<int>(n)) == 1 &&
                  static_cast<size_t>(len) == n;
  return ok ? absl::OkStatus()
            : absl::InternalError("AES-GCM failed to open part of a record");
}

absl::Status WireSeal::OpenEnd(const uint8_t* tag) {
  EVP_CIPHER_CTX* c = Ctx(ctx_);
  uint8_t tail[16];
  int len = 0;
  uint8_t want[kTagBytes];
  std::memcpy(want, tag, kTagBytes);
  const bool ok =
      EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, kTagBytes, want) == 1 &&
      EVP_DecryptFinal_ex(c, tail, &len) == 1;
  return ok ? absl::OkStatus()
            : absl::DataLossError(
                  "a wire record failed authentication (AES-GCM tag): "
                  "altered, replayed or out of order");
}

absl::Status WireSeal::Open(uint8_t* data, size_t n,
                            absl::Span<const uint8_t> aad) {
  absl::Status s = OpenBegin(aad);
  if (s.ok()) s = OpenPart(data, n);
  if (!s.ok()) return s;
  return OpenEnd(data + n);
}

}  // namespace halka
