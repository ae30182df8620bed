// Dead intermediates leave the L2 without a write-back (bench/NOTES.md 27).  V and M are
// written once and read once per launch; a dirty line the reader has finished with would
// otherwise still be written back to DRAM when evicted (ncu, vgg16.conv1_2: 4.5 GB written
// for 0.8 GB of y).  discard.global.L2 invalidates a 128-byte line without the write-back.
// A task drops what it was the last reader of, after its barrier: the GEMM task the V rows of
// its group and position when it is their only reader (one K block), the output task the
// M lines that lie wholly inside its channels.  Contents of discarded lines are undefined
// until the next launch writes them again; Params::discard = 0 (Plan(keep_intermediates=True))
// keeps V and M readable for the host.
#pragma once

#include "generated_tasks.cuh"
#include "params.cuh"

#ifndef MW_L2_DISCARD
#define MW_L2_DISCARD 0
#endif

namespace mw {

// The 128-byte lines wholly inside [begin, end), spread over the block's threads.
__device__ __forceinline__ void discard_lines(const float* begin, const float* end) {
  const unsigned long long first = (reinterpret_cast<unsigned long long>(begin) + 127ull) & ~127ull;
  const unsigned long long last = reinterpret_cast<unsigned long long>(end) & ~127ull;
  for (unsigned long long line = first + 128ull * threadIdx.x; line < last; line += 128ull * blockDim.x)
    asm volatile("discard.global.L2 [%0], 128;" ::"l"(line) : "memory");
}

// After a task's closing barrier: drop the intermediate lines no later task reads.
template <int ALPHA2>
__device__ __forceinline__ void discard_dead_inputs(const Params& p, int type, int group, int index) {
  if (!MW_L2_DISCARD || !p.discard) return;
  const long long tpg = p.tiles_per_group, t0 = static_cast<long long>(group) * tpg;
  if (type == TASK_GEMM && p.k_blocks == 1) {
    const long long cs = p.c_stride;
    const float* rows = reinterpret_cast<const float*>(p.V) + index * p.tiles_padded * cs + t0 * cs;
    discard_lines(rows, rows + tpg * cs);
  } else if (type == TASK_OUTPUT) {
    const long long ks = p.k_stride;
    const int K = static_cast<int>(p.K), per = static_cast<int>(p.output_k_per_task);
    const int k0 = index * per, k1 = min(K, k0 + per);
    // Channels past K (row padding) are read by nobody: the row's last task takes them too.
    const long long c1 = k1 == K ? ks : k1;
    const float* mbuf = reinterpret_cast<const float*>(p.Mbuf) + t0 * ks;
    for (int pos = 0; pos < ALPHA2; ++pos) {
      const float* rows = mbuf + pos * p.tiles_padded * ks;
      if (k0 == 0 && c1 == ks) {
        discard_lines(rows, rows + tpg * ks);            // whole rows: one range
      } else if (ks % 32 == 0 && k0 % 32 == 0) {
        for (long long t = 0; t < tpg; ++t) discard_lines(rows + t * ks + k0, rows + t * ks + c1);
      }
    }
  }
}

}  // namespace mw
