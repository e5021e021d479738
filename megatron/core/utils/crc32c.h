// CRC-32C (Castagnoli polynomial 0x1EDC6F41, reflected 0x82F63B78), as used by iSCSI (RFC 3720
// appendix B.4), TFRecord framing and our checkpoint checksums.
//
// Uses the SSE4.2 crc32 instruction when the CPU has it, else a table-driven software path;
// both give identical results. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace megatron {

/// Continues a CRC-32C: crc32c_extend(crc32c(a), b) == crc32c(a ++ b). Start with crc = 0.
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n);

/// CRC-32C of `n` bytes (e.g. crc32c("123456789", 9) == 0xE3069283, RFC 3720's check value).
inline uint32_t crc32c(const void* data, size_t n) { return crc32c_extend(0, data, n); }

/// TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2^32).
inline uint32_t crc32c_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

}  // namespace megatron
