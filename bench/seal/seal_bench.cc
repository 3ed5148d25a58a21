// Seal and open throughput of one wire unit, in place, by engine and size:
// OpenSSL's AES-128-OCB (the wire links' default engine) and AES-128-GCM,
// and halka's opt-in VAES-512 OCB (seal/wire_ocb.h) where this CPU has
// it and its self-test passes. GB/s of payload, best of five rounds of
// about 0.2 s each (or the seconds given); every opened unit is checked
// against its plaintext.
//
//   build/bench/seal/halka-seal-bench [seconds per round]
#include <openssl/evp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "seal/wire_ocb.h"
#include "seal/wire_seal.h"

namespace {

using Clock = std::chrono::steady_clock;

// One engine: seals `n` bytes of buf in place (ciphertext, tag at buf + n),
// or opens them; false when a unit does not open.
struct Engine {
  std::string name;
  std::function<void(uint8_t* buf, size_t n, const uint8_t nonce[12])> seal;
  std::function<bool(uint8_t* buf, size_t n, const uint8_t nonce[12])> open;
};

Engine OpenSsl(const char* name, const EVP_CIPHER* cipher, const uint8_t* key) {
  std::shared_ptr<EVP_CIPHER_CTX> enc(EVP_CIPHER_CTX_new(), EVP_CIPHER_CTX_free);
  std::shared_ptr<EVP_CIPHER_CTX> dec(EVP_CIPHER_CTX_new(), EVP_CIPHER_CTX_free);
  EVP_EncryptInit_ex(enc.get(), cipher, nullptr, key, nullptr);
  EVP_DecryptInit_ex(dec.get(), cipher, nullptr, key, nullptr);
  Engine e;
  e.name = name;
  e.seal = [enc](uint8_t* buf, size_t n, const uint8_t nonce[12]) {
    int len = 0, tail = 0;
    EVP_EncryptInit_ex(enc.get(), nullptr, nullptr, nullptr, nonce);
    EVP_EncryptUpdate(enc.get(), buf, &len, buf, static_cast<int>(n));
    EVP_EncryptFinal_ex(enc.get(), buf + len, &tail);
    EVP_CIPHER_CTX_ctrl(enc.get(), EVP_CTRL_AEAD_GET_TAG, 16, buf + n);
  };
  e.open = [dec](uint8_t* buf, size_t n, const uint8_t nonce[12]) {
    int len = 0, tail = 0;
    uint8_t tag[16];
    std::memcpy(tag, buf + n, 16);
    return EVP_DecryptInit_ex(dec.get(), nullptr, nullptr, nullptr, nonce) == 1 &&
           EVP_DecryptUpdate(dec.get(), buf, &len, buf, static_cast<int>(n)) == 1 &&
           EVP_CIPHER_CTX_ctrl(dec.get(), EVP_CTRL_AEAD_SET_TAG, 16, tag) == 1 &&
           EVP_DecryptFinal_ex(dec.get(), buf + len, &tail) == 1;
  };
  return e;
}

Engine Vaes(const uint8_t* key) {
  auto ocb = std::make_shared<halka::WireOcb>(key);
  Engine e;
  e.name = "halka vaes-512 ocb";
  e.seal = [ocb](uint8_t* buf, size_t n, const uint8_t nonce[12]) {
    ocb->Begin(nonce, nullptr, 0, buf);
    ocb->Update(buf, n);
    ocb->Finish();
  };
  e.open = [ocb](uint8_t* buf, size_t n, const uint8_t nonce[12]) {
    return ocb->Open(nonce, nullptr, 0, buf, n, buf + n);
  };
  return e;
}

double g_round_seconds = 0.2;

// Best GB/s over five rounds of `op` (which returns the bytes it did).
template <typename Op>
double Rate(Op op) {
  double best = 0;
  for (int round = 0; round < 5; ++round) {
    const auto start = Clock::now();
    size_t bytes = 0;
    do {
      for (int k = 0; k < 8; ++k) bytes += op();
    } while (std::chrono::duration<double>(Clock::now() - start).count() <
             g_round_seconds);
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    best = std::max(best, static_cast<double>(bytes) / s / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) {
    char* end = nullptr;
    g_round_seconds = std::strtod(argv[1], &end);
    if (end == argv[1] || *end != '\0' || !(g_round_seconds > 0) ||
        g_round_seconds > 10) {
      std::fprintf(stderr, "usage: %s [seconds per round, (0, 10]]\n", argv[0]);
      return 2;
    }
  }
  uint8_t key[16];
  for (int i = 0; i < 16; ++i) key[i] = static_cast<uint8_t>(i * 37 + 1);
  std::vector<Engine> engines;
  engines.push_back(OpenSsl("openssl aes-128-ocb", EVP_aes_128_ocb(), key));
  engines.push_back(OpenSsl("openssl aes-128-gcm", EVP_aes_128_gcm(), key));
  const absl::Status vaes =
      halka::WireSeal::CheckEngine(halka::WireSealEngine::kVaes512);
  if (vaes.ok()) {
    engines.push_back(Vaes(key));
  } else {
    std::printf("# no halka vaes-512 row: %s\n",
                std::string(vaes.message()).c_str());
  }
  const size_t sizes[] = {4096, 65536, 262144, 1 << 20, 4 << 20};
  std::printf("%-22s %-6s", "engine (GB/s)", "op");
  for (size_t n : sizes) std::printf(" %9zuK", n / 1024);
  std::printf("\n");
  int failures = 0;
  for (const Engine& e : engines) {
    for (const bool sealing : {true, false}) {
      std::printf("%-22s %-6s", e.name.c_str(), sealing ? "seal" : "open");
      for (size_t n : sizes) {
        std::vector<uint8_t> plain(n), buf(n + 16);
        for (size_t i = 0; i < n; ++i) plain[i] = static_cast<uint8_t>(i * 131 + 7);
        uint8_t nonce[12] = {};
        uint64_t counter = 0;
        double rate;
        if (sealing) {
          rate = Rate([&] {
            std::memcpy(nonce + 4, &++counter, 8);
            e.seal(buf.data(), n, nonce);
            return n;
          });
        } else {
          // Opening the same sealed unit again and again would decrypt
          // ciphertext already opened: seal a fresh copy each time from a
          // sealed original instead, and count only the opening's time by
          // subtracting the copy's rate.
          std::memcpy(buf.data(), plain.data(), n);
          e.seal(buf.data(), n, nonce);
          const std::vector<uint8_t> sealed = buf;
          const double copy = Rate([&] {
            std::memcpy(buf.data(), sealed.data(), n + 16);
            return n;
          });
          const double both = Rate([&] {
            std::memcpy(buf.data(), sealed.data(), n + 16);
            if (!e.open(buf.data(), n, nonce)) ++failures;
            return n;
          });
          rate = 1.0 / (1.0 / both - 1.0 / copy);
          std::memcpy(buf.data(), sealed.data(), n + 16);
          if (!e.open(buf.data(), n, nonce) ||
              std::memcmp(buf.data(), plain.data(), n) != 0) {
            ++failures;
          }
        }
        std::printf(" %10.2f", rate);
        std::fflush(stdout);
      }
      std::printf("\n");
    }
  }
  if (failures > 0) {
    std::printf("FAILED: %d units did not open to their plaintext\n", failures);
    return 1;
  }
  return 0;
}
