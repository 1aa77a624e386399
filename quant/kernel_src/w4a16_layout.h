// w4a16_layout.h: where each 4-bit weight of an int4 weight-only GEMM lives in our packed layout.
// This file is the only definition of that layout: the pack / unpack ops (CPU and CUDA) and the
// GEMM kernels all index through it.
//
// The logical weight is W[k, n], K x N (K input features, N outputs), each a 4-bit code q in
// [0, 15]. The layout serves tensor-core GEMMs (mma.sync m16n8k16, B operand) directly from 16-byte
// loads:
//   - W is cut into tiles of 16 k x 64 n. Tile (kt, nt) is 128 consecutive 32-bit words at word
//     (kt * (N / 64) + nt) * 128: a packed weight is int32 [K / 16, 2 N], rows of 16 k.
//   - In a tile, lane l (0..31) of a warp owns words 4 l .. 4 l + 3: one 16-byte load per lane, and
//     a warp's loads cover the tile's 512 bytes contiguously.
//   - Word j of lane l holds the B-fragment elements of that lane for the two n8 blocks f = 2 j and
//     2 j + 1 of the tile: column n = 8 f + l / 4, rows k = 2 c, 2 c + 1, 2 c + 8, 2 c + 9 with
//     c = l % 4 (the m16n8k16 B fragment: b0, b1, b2, b3).
//   - Nibble p (bits 4 p .. 4 p + 3) of the word is row 2 c + (p >> 2) + 8 (p & 1) of block
//     2 j + ((p >> 1) & 1). So (word >> 4 i) & 0x000F000F (i = 0..3) puts two fragment elements in
//     the low bits of two 16-bit halves: (b0, b1) and (b2, b3) of block 2 j for i = 0, 1, and of
//     block 2 j + 1 for i = 2, 3, ready for the OR-with-exponent conversion to fp16 / bf16 pairs.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define W4_HOST_DEVICE __host__ __device__
#else
#define W4_HOST_DEVICE
#endif

namespace quant {
namespace w4 {

constexpr int64_t kTileK = 16;                       // k rows of a tile (one mma k-step)
constexpr int64_t kTileN = 64;                       // n columns of a tile
constexpr int64_t kNibblesPerWord = 8;               // 4-bit codes per 32-bit word
constexpr int64_t kTileWords = kTileK * kTileN / 8;  // 128 words, 512 bytes
constexpr int64_t kWordsPerLane = kTileWords / 32;   // 4: one 16-byte load
constexpr int64_t kZeroPoint = 8;                    // the implicit zero of symmetric codes

// Words per row of 16 k of a packed weight with n columns: int32 [K / 16, packed_row_words(N)].
constexpr W4_HOST_DEVICE int64_t packed_row_words(int64_t n) { return n / kTileN * kTileWords; }

// The position of W[k, n] in a packed weight with N columns: word index from the start, and the
// nibble (0..7) in that word.
struct NibblePos {
  int64_t word;
  int nibble;
};

inline W4_HOST_DEVICE NibblePos position_of(int64_t k, int64_t n, int64_t N) {
  const int64_t kt = k / kTileK, nt = n / kTileN;
  const int kin = static_cast<int>(k % kTileK), nin = static_cast<int>(n % kTileN);
  const int f = nin / 8;  // n8 block of the tile
  const int lane = (nin % 8) * 4 + (kin % 8) / 2;
  const int j = f / 2;  // word of the lane
  const int p = (kin % 2) * 4 + (kin / 8) + (f % 2) * 2;
  return {(kt * (N / kTileN) + nt) * kTileWords + lane * kWordsPerLane + j, p};
}

// The other direction: the element (k, n within the tile) that nibble p of word j of lane l holds.
struct TileElement {
  int k, n;
};

inline W4_HOST_DEVICE TileElement tile_element(int lane, int j, int p) {
  const int c = lane % 4;
  return {2 * c + (p >> 2) + 8 * (p & 1), 8 * (2 * j + ((p >> 1) & 1)) + lane / 4};
}

}  // namespace w4
}  // namespace quant
