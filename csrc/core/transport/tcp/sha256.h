// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the handshake's challenge and answer.
//
// Written here rather than taken from a crypto library because the core has no external
// dependencies and needs nothing else: the group token is a key that never crosses the wire, and
// each side proves it knows it by a MAC over fresh nonces. Speed does not matter (a few hashes per
// connection); clarity and test vectors (tests/native/test_handshake.cc) do.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace pycomm::transport::tcp {

using Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  static constexpr size_t kBlockBytes = 64;

  Sha256();
  void update(const void* data, size_t nbytes);
  // The digest of everything given to update(); the object is spent afterwards.
  Digest finish();

 private:
  void compress(const uint8_t* block);

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, kBlockBytes> buffer_{};
  size_t buffered_ = 0;
  uint64_t totalBytes_ = 0;
};

Digest sha256(const void* data, size_t nbytes);

class HmacSha256 {
 public:
  HmacSha256(const void* key, size_t keyBytes);
  void update(const void* data, size_t nbytes) { inner_.update(data, nbytes); }
  Digest finish();

 private:
  Sha256 inner_;
  std::array<uint8_t, Sha256::kBlockBytes> outerPad_{};
};

// Compares without an early exit, so the time taken says nothing about how many bytes matched.
bool equalInConstantTime(const uint8_t* a, const uint8_t* b, size_t nbytes);

}  // namespace pycomm::transport::tcp
