// Inline-PTX wrappers: every asm statement of the kernels lives here.
#pragma once

#include "params.cuh"

namespace mw {

// Shared-memory address of a generic pointer, as the .shared instructions take it.
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy that bypasses L1 (.cg) to a shared-window address; !valid reads
// nothing and zero-fills.
__device__ __forceinline__ void cp_async_cg16_shared(unsigned smem, const float* gmem, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(bytes)
               : "memory");
}
// The same to a generic pointer into shared memory.
__device__ __forceinline__ void cp_async_cg16(float* smem, const float* gmem, bool valid) {
  cp_async_cg16_shared(smem_addr(smem), gmem, valid);
}
// 4-byte global -> shared copy through L1 (.ca: gathers reuse neighbouring words); !valid zero-fills.
__device__ __forceinline__ void cp_async_ca4(float* smem, const float* gmem, bool valid) {
  const unsigned s = smem_addr(smem);
  const int bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most PENDING commit groups of this thread are in flight.
template <int PENDING>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
}

// NAME: d += a * b on the tensor cores, NAME_zero: d = a * b (the accumulator input is zero), for
// one mma.sync SHAPE: m16n8k8 TF32 (a 16 x 8 row, b 8 x 8 col) or m16n8k16 BF16 pairs (a 16 x 16,
// b 16 x 8, the lower k in each pair's low half), fp32 sums.  Not volatile: the MMA is a pure
// function of its operands, so the compiler may interleave independent MMAs.
#define MW_MMA_SYNC(NAME, SHAPE)                                                                   \
  __device__ __forceinline__ void NAME(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {  \
    asm("mma.sync.aligned." SHAPE " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"            \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                               \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));                           \
  }                                                                                                    \
  __device__ __forceinline__ void NAME##_zero(float (&d)[4], const unsigned (&a)[4],                    \
                                              const unsigned (&b)[2]) {                                 \
    asm("mma.sync.aligned." SHAPE " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"        \
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])                                               \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(0.0f));                \
  }
MW_MMA_SYNC(mma_tf32, "m16n8k8.row.col.f32.tf32.tf32.f32")
MW_MMA_SYNC(mma_bf16, "m16n8k16.row.col.f32.bf16.bf16.f32")
#undef MW_MMA_SYNC

// Two floats rounded to nearest-even BF16 and packed: lo in the low half.
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
  unsigned d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

// %tid.x through volatile asm: unlike threadIdx.x, NVVM cannot hoist what is derived from it out
// of the megakernel's ticket loop, where it would stay live (and spill) through other tasks.
__device__ __forceinline__ int thread_index() {
  unsigned t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return static_cast<int>(t);
}

// A store ptxas knows is global, so it may move shared-memory loads ahead of it (a generic
// store might alias them).
__device__ __forceinline__ void st_global(float* ptr, float v) {
  asm volatile("st.global.f32 [%0], %1;" :: "l"(ptr), "f"(v) : "memory");
}
// The same with the cache-streaming hint: the line is the first evicted (for data no one reads
// again soon, so that it does not evict data that is).
__device__ __forceinline__ void st_global_streaming(float* ptr, float v) {
  asm volatile("st.global.cs.f32 [%0], %1;" :: "l"(ptr), "f"(v) : "memory");
}

// A 16-bit global store (the split BF16 operands: cuda/split_operand.cuh).
__device__ __forceinline__ void st_global_b16(unsigned short* ptr, unsigned short v) {
  asm volatile("st.global.b16 [%0], %1;" :: "l"(ptr), "h"(v) : "memory");
}

__device__ __forceinline__ void st_global_u32(unsigned* ptr, unsigned v) {
  asm volatile("st.global.b32 [%0], %1;" :: "l"(ptr), "r"(v) : "memory");
}

// x rounded to nearest-even BF16 (its bits), and a BF16's value.
__device__ __forceinline__ unsigned short bf16_rn(float x) {
  unsigned short d;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(d) : "f"(x));
  return d;
}
__device__ __forceinline__ float bf16_value(unsigned short b) { return __uint_as_float(static_cast<unsigned>(b) << 16); }

// Shared-memory store / load the compiler can neither forward through a register nor drop,
// so a value parked in shared memory really leaves the registers.
__device__ __forceinline__ void sts_f32(unsigned a, float v) {
  asm volatile("st.shared.f32 [%0], %1;" ::"r"(a), "f"(v));
}
__device__ __forceinline__ float lds_f32(unsigned a) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(a));
  return v;
}
// The same for 16 bytes at a shared-window address.
__device__ __forceinline__ float4 lds_f32x4(unsigned a) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(a));
  return v;
}
__device__ __forceinline__ void sts_u32x4(unsigned a, unsigned x, unsigned y, unsigned z, unsigned w) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(a), "r"(x), "r"(y), "r"(z), "r"(w) : "memory");
}

// Hides four values from the optimizer, so that arithmetic on them is not hoisted out of a loop
// (where it would hold registers across the loop body).
__device__ __forceinline__ void opaque(int& a, int& b, int& c, int& d) {
  asm volatile("" : "+r"(a), "+r"(b), "+r"(c), "+r"(d));
}

// Scheduler memory operations: the counter protocol is acquire / release at GPU scope.
__device__ __forceinline__ unsigned ld_acquire_gpu(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ int atom_acq_rel_gpu_add(int* p, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

__device__ __forceinline__ void red_release_gpu_add(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return static_cast<long long>(t);
}

__device__ __forceinline__ int sm_id() {
  unsigned s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return static_cast<int>(s);
}

#if MW_GEMM_WGMMA
// Warpgroup MMA (sm_90a).  Shared memory written with ordinary stores must be ordered before
// the tensor cores read it (fence_proxy_async_smem in each writing thread, then a barrier).
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Keeps the compiler from touching accumulators across an asynchronous MMA.
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// Descriptor of an unswizzled K-major shared-memory operand: core matrices of 8 rows x 16
// bytes, k_step_bytes apart along K and row_step_bytes apart along M / N.
__device__ __forceinline__ unsigned long long wgmma_desc(unsigned address, unsigned k_step_bytes,
                                                         unsigned row_step_bytes) {
  return static_cast<unsigned long long>((address & 0x3FFFF) >> 4) |
         (static_cast<unsigned long long>((k_step_bytes >> 4) & 0x3FFF) << 16) |
         (static_cast<unsigned long long>((row_step_bytes >> 4) & 0x3FFF) << 32);
}
// Descriptor of a K-major shared-memory operand in the 64-byte swizzle: rows of 64 bytes, the
// 16-byte chunk c of row r at c ^ ((r / 2) % 4) (address bits 4-5 ^= bits 7-8, so the operand
// starts 512-byte aligned), 8-row groups row_group_bytes apart; a k offset inside the row is
// added to the address.
__device__ __forceinline__ unsigned long long wgmma_desc_swizzle64(unsigned address, unsigned row_group_bytes) {
  return static_cast<unsigned long long>((address & 0x3FFFF) >> 4) | (1ull << 16) |
         (static_cast<unsigned long long>((row_group_bytes >> 4) & 0x3FFF) << 32) | (2ull << 62);
}
// Descriptor of a K-major shared-memory operand in the 128-byte swizzle: rows of 128 bytes, the
// 16-byte chunk c of row r at c ^ (r % 8) (address bits 4-6 ^= bits 7-9, so the operand starts
// 1024-byte aligned), 8-row groups 1024 bytes apart; a k offset inside the row is added to the
// address.
__device__ __forceinline__ unsigned long long wgmma_desc_swizzle128(unsigned address) {
  return static_cast<unsigned long long>((address & 0x3FFFF) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}
// d (+)= a (64 x 8, registers, the m16n8k8 A fragment per warp) * b (8 x N, shared memory);
// accumulate == 0 ignores d's old value.
// One asm template for both shapes: N columns, the accumulator's N / 2 registers as operands
// 0 .. N / 2 - 1, then a (4), the B descriptor and the accumulate flag.
#define MW_WGMMA_TF32_RS(N, D_LIST, A0, A1, A2, A3, B, FLAG, ...)                                  \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #FLAG ", 0;\n"                                 \
               "wgmma.mma_async.sync.aligned.m64n" #N "k8.f32.tf32.tf32 {" D_LIST "}, "                 \
               "{%" #A0 ", %" #A1 ", %" #A2 ", %" #A3 "}, %" #B ", p, 1, 1;\n}\n"                      \
               : __VA_ARGS__                                                                          \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate))
__device__ __forceinline__ void wgmma_tf32_m64n64k8(float (&d)[32], const unsigned (&a)[4],
                                                    unsigned long long b_desc, int accumulate) {
  MW_WGMMA_TF32_RS(64, "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31",
                   32, 33, 34, 35, 36, 37, "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]));
}
__device__ __forceinline__ void wgmma_tf32_m64n32k8(float (&d)[16], const unsigned (&a)[4],
                                                    unsigned long long b_desc, int accumulate) {
  MW_WGMMA_TF32_RS(32, "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15", 16, 17, 18, 19, 20, 21,
                   "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]));
}
// m64n128k8: the warp-specialized tile's (cuda/gemm_warp_specialized.cuh) 64 accumulators.
__device__ __forceinline__ void wgmma_tf32_m64n128k8(float (&d)[64], const unsigned (&a)[4],
                                                     unsigned long long b_desc, int accumulate) {
  MW_WGMMA_TF32_RS(128, "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63",
                   64, 65, 66, 67, 68, 69, "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]));
}
#undef MW_WGMMA_TF32_RS
// d (+)= a (64 x 16, shared memory) * b (16 x N, shared memory), BF16 operands, both K-major;
// accumulate == 0 ignores d's old value.
#define MW_WGMMA_BF16_SS(N, D_LIST, A, B, FLAG, ...)                                               \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #FLAG ", 0;\n"                                 \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 {" D_LIST "}, "                \
               "%" #A ", %" #B ", p, 1, 1, 0, 0;\n}\n"                                               \
               : __VA_ARGS__                                                                          \
               : "l"(a_desc), "l"(b_desc), "r"(accumulate))
__device__ __forceinline__ void wgmma_bf16_m64n64k16(float (&d)[32], unsigned long long a_desc,
                                                     unsigned long long b_desc, int accumulate) {
  MW_WGMMA_BF16_SS(64, "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31",
                   32, 33, 34, "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]));
}
__device__ __forceinline__ void wgmma_bf16_m64n32k16(float (&d)[16], unsigned long long a_desc,
                                                     unsigned long long b_desc, int accumulate) {
  MW_WGMMA_BF16_SS(32, "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15", 16, 17, 18,
                   "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]));
}
#undef MW_WGMMA_BF16_SS

// mbarrier (sm_90) and register reallocation: the warp-specialized GEMM's ring
// (cuda/gemm_warp_specialized.cuh).
__device__ __forceinline__ void mbarrier_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbarrier_arrive(unsigned bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}" ::"r"(bar) : "memory");
}
// The barrier's arrival of this thread once all its earlier cp.async copies have landed (counted
// in the barrier's expected arrivals: .noinc).
__device__ __forceinline__ void cp_async_mbarrier_arrive(unsigned bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
// Whether the phase of `parity` of the barrier has completed (a bounded wait: the caller loops).
__device__ __forceinline__ bool mbarrier_try_wait(unsigned bar, unsigned parity) {
  unsigned done;
  asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
               : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  return done != 0;
}
template <int REGS>
__device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(REGS)); }
template <int REGS>
__device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(REGS)); }
#endif  // MW_GEMM_WGMMA

}  // namespace mw
