// Direct convolution (any R x S, stride and padding pairs), float32, implicit-GEMM style.
//
//   GEMM view:  M = N * OH * OW output pixels, "N" = K output channels,
//               reduction over kk = (c, r, s) for NCHW, (r, s, c) for NHWC.
//
// The input is never copied: a thread block gathers a BK x BM slab of the
// implicit im2col matrix straight from x, using a per-layer table
//   table[kk] = {offset of (c, r, s) relative to a pixel's base, tap bits of (r, s)}
// (tap bits: bit r | bit (MW_DIRECT_TAP_COL_BIT + s)) and per pixel {base, outside taps}:
// the bits of the filter rows and columns that fall outside the image for that pixel,
// plus MW_DIRECT_TAP_SENTINEL.  One AND decides an element (padding, stride, partial
// tiles, reduction tail): table rows past C*R*S carry the sentinel bit, pixels past M
// have every bit set, so both always read zero.
// Filters are pre-packed on the host side into wt[CRSp][ldw]
// (CRSp = C*R*S rounded up to 16, ldw = K rounded up to 128, zero padding), so
// every B load is an aligned float4 with no predicate.
//
// Block tile BM (pixels) x BN (channels) x BK (reduction), register tile TM x TN,
// (BM/TM) * (BN/TN) threads.  Global -> shared copies are cp.async (4-byte gathers of x
// with zero-fill for padding and tails, 16-byte rows of wt) in an STAGES-deep ring:
// no registers hold loads in flight, so the FFMAs of tile k overlap the copies of
// tiles k+1 .. k+STAGES-1.  STAGES comes from megawino/direct/config.py.
#pragma once

#include "ptx.cuh"

// Tap-bit layout (megawino/direct/config.py TAP_COL_BIT, TAP_SENTINEL: passed by DirectConfig.defines).
#ifndef MW_DIRECT_TAP_COL_BIT
#define MW_DIRECT_TAP_COL_BIT 15
#endif
#ifndef MW_DIRECT_TAP_SENTINEL
#define MW_DIRECT_TAP_SENTINEL 0x80000000u
#endif
// Pipeline depth (DirectConfig.stages: as many as fit the static shared-memory budget).
#ifndef MW_DIRECT_STAGES
#define MW_DIRECT_STAGES 2
#endif
// Reduction terms per flush of the register tile into y (0: no flush, one chain).
#ifndef MW_DIRECT_FLUSH_TERMS
#define MW_DIRECT_FLUSH_TERMS 0
#endif

namespace mw_direct {

struct Params {
    const float* __restrict__ x;      // input, NCHW or NHWC
    const float* __restrict__ wt;     // packed filters [CRSp][ldw]
    const int2* __restrict__ table;   // [CRSp] {offset, tap bits}
    float* __restrict__ y;            // output, same layout as x
    int C, H, W, K, R, S;
    int OH, OW, M;                    // M = N * OH * OW
    int stride_h, stride_w;           // each dimension its own (LayerSpec.stride / padding pairs)
    int pad_h, pad_w;
    int ktiles;                       // ceil(C*R*S / BK)
    int ldw;                          // row length of wt (multiple of 128)
    int vec_x;                        // 1: 1x1, stride 1, no padding, NCHW, OH*OW % 4 == 0 and
                                      // x 16-byte aligned: x rows are copied 4 pixels at a time
};

template <int BM, int BN, int BK, int TM, int TN, bool NHWC>
struct Tile {
    static constexpr int TX = BM / TM;           // threads along pixels
    static constexpr int TY = BN / TN;           // threads along channels
    static constexpr int THREADS = TX * TY;
    static constexpr int A_ELEMS = BM * BK;
    static constexpr int A_PER = (A_ELEMS + THREADS - 1) / THREADS;
    static constexpr int A_VECS = A_ELEMS / 4;                // vec_x: float4 copies per tile
    static constexpr int A_VEC_PER = (A_VECS + THREADS - 1) / THREADS;
    static constexpr int B_VECS = BN * BK / 4;
    static constexpr int B_PER = (B_VECS + THREADS - 1) / THREADS;
    static constexpr int LDA = BM + 4;           // +16 B per row: float4-aligned, fewer conflicts
    static constexpr int LDB = BN + 4;
    static constexpr int STAGES = MW_DIRECT_STAGES;
    static constexpr int SMEM_BYTES = STAGES * BK * (LDA + LDB) * 4 + (NHWC ? BM * 16 : 0);

    static_assert(BM % TM == 0 && BN % TN == 0, "tile must divide block");
    static_assert(TM % 4 == 0 && TN % 4 == 0, "register tile is read as float4");
    static_assert(BM % 4 == 0 && BN % 4 == 0 && BN <= 128 && 128 % BN == 0,
                  "BN must divide 128 (packed filter row padding)");
    static_assert(BK <= 16 && 16 % BK == 0, "BK must divide 16 (packed filter padding)");
    static_assert(THREADS % 32 == 0 && THREADS <= 1024, "threads");
    static_assert(STAGES >= 2, "the ring needs two stages at least");
    // NCHW: threads run along pixels (coalesced along ox); each thread owns one pixel.
    static_assert(NHWC || (THREADS % BM == 0 && A_ELEMS % THREADS == 0),
                  "NCHW gather needs THREADS % BM == 0 and BM*BK % THREADS == 0");
    // NHWC: threads run along the reduction (coalesced along c); each thread owns one kk row.
    static_assert(!NHWC || THREADS % BK == 0, "NHWC gather needs THREADS % BK == 0");
};

template <int BM, int BN, int BK, int TM, int TN, bool NHWC>
__device__ __forceinline__ void write_tile(const Params& p, const float (&acc)[TM][TN], bool add,
                                           int m0, int k0n, int tx, int ty);

template <int BM, int BN, int BK, int TM, int TN, bool NHWC>
__device__ __forceinline__ void conv_block(const Params& p) {
    using T = Tile<BM, BN, BK, TM, TN, NHWC>;
    constexpr int THREADS = T::THREADS;
    constexpr int A_PER = T::A_PER;
    constexpr int B_PER = T::B_PER;
    constexpr int LDA = T::LDA;
    constexpr int LDB = T::LDB;

    constexpr int STAGES = T::STAGES;
    __shared__ __align__(16) float As[STAGES][BK][LDA];
    __shared__ __align__(16) float Bs[STAGES][BK][LDB];
    __shared__ __align__(16) int2 minfo[NHWC ? BM : 1];   // {base, outside taps} per pixel

    const int tid = threadIdx.x;
    const int m0 = blockIdx.x * BM;
    const int k0n = blockIdx.y * BN;
    const int P = p.OH * p.OW;

    // ---- per-pixel gather origin ------------------------------------------
    // {base offset of the pixel's window in x, tap bits outside the image | sentinel}.
    auto pixel_info = [&](int m) -> int2 {
        if (m >= p.M) return make_int2(0, -1);   // every tap outside
        const int n = m / P;
        const int pix = m - n * P;
        const int oy = pix / p.OW;
        const int ox = pix - oy * p.OW;
        const int iy0 = oy * p.stride_h - p.pad_h;
        const int ix0 = ox * p.stride_w - p.pad_w;
        unsigned outside = MW_DIRECT_TAP_SENTINEL;
        for (int r = 0; r < p.R; ++r)
            if ((unsigned)(iy0 + r) >= (unsigned)p.H) outside |= 1u << r;
        for (int s = 0; s < p.S; ++s)
            if ((unsigned)(ix0 + s) >= (unsigned)p.W) outside |= 1u << (MW_DIRECT_TAP_COL_BIT + s);
        const int base = NHWC ? ((n * p.H + iy0) * p.W + ix0) * p.C : (n * p.C * p.H + iy0) * p.W + ix0;
        return make_int2(base, static_cast<int>(outside));
    };

    int2 my_pixel = make_int2(0, -1);
    if constexpr (NHWC) {
        for (int i = tid; i < BM; i += THREADS) minfo[i] = pixel_info(m0 + i);
        __syncthreads();
    } else {
        my_pixel = pixel_info(m0 + tid % BM);
    }
    // NCHW: the thread's gather base as a 64-bit address (it may point before x for a
    // padded window; only in-image offsets from it are read) and its first table row.
    const unsigned long long my_x = reinterpret_cast<unsigned long long>(p.x) + 4ll * my_pixel.x;
    const int2* my_table = p.table + (NHWC ? 0 : tid / BM);

    // vec_x: a thread copies pixels 4q .. 4q+3 of the block (q fixed per thread, since
    // THREADS is a multiple of BM / 4); x_quad = offset of x[n][0][pix], -1 past M.
    static_assert(NHWC || THREADS % (BM / 4) == 0, "vec_x needs THREADS % (BM / 4) == 0");
    const int quad = tid % (BM / 4);
    int x_quad = -1;
    if (!NHWC && p.vec_x && m0 + 4 * quad < p.M) {
        const int n = (m0 + 4 * quad) / P;
        x_quad = n * p.C * P + (m0 + 4 * quad - n * P);
    }

    // Issues the copies of k-tile kt into ring slot `slot` (no wait).
    auto load_tile = [&](int kt, int slot) {
        const int kbase = kt * BK;
        if (!NHWC && p.vec_x) {
#pragma unroll
            for (int i = 0; i < T::A_VEC_PER; ++i) {
                const int e = tid + i * THREADS;
                if (T::A_VECS % THREADS == 0 || e < T::A_VECS) {
                    const int krow = e / (BM / 4);
                    const bool inside = x_quad >= 0 && kbase + krow < p.C;
                    mw::cp_async_cg16(&As[slot][krow][4 * quad],
                                      inside ? p.x + x_quad + (kbase + krow) * P : p.x, inside);
                }
            }
        } else {
            float* a_slot = &As[slot][0][0];
            const int2* tile_table = my_table + kbase;
#pragma unroll
            for (int i = 0; i < A_PER; ++i) {
                const int e = tid + i * THREADS;
                if (T::A_ELEMS % THREADS == 0 || e < T::A_ELEMS) {
                    int krow, col;
                    int2 t;
                    const float* src;
                    bool inside;
                    if constexpr (NHWC) {
                        krow = e % BK;
                        col = e / BK;
                        const int2 pix = minfo[col];
                        t = __ldg(&p.table[kbase + krow]);
                        inside = (static_cast<unsigned>(t.y) & static_cast<unsigned>(pix.y)) == 0u;
                        src = p.x + (inside ? static_cast<unsigned>(pix.x + t.x) : 0u);
                    } else {   // THREADS % BM == 0: the thread's pixel is tid % BM for every i
                        krow = i * (THREADS / BM) + tid / BM;
                        col = tid % BM;
                        t = __ldg(&tile_table[i * (THREADS / BM)]);
                        inside = (static_cast<unsigned>(t.y) & static_cast<unsigned>(my_pixel.y)) == 0u;
                        // Outside: -base lands on x itself (a valid address; nothing is read
                        // with src-size 0).
                        src = reinterpret_cast<const float*>(my_x + 4ll * (inside ? t.x : -my_pixel.x));
                    }
                    mw::cp_async_ca4(a_slot + krow * LDA + col, src, inside);
                }
            }
        }
#pragma unroll
        for (int j = 0; j < B_PER; ++j) {
            const int e = tid + j * THREADS;
            if (T::B_VECS % THREADS == 0 || e < T::B_VECS) {
                const int row = e / (BN / 4);
                const int col = (e % (BN / 4)) * 4;
                mw::cp_async_cg16(&Bs[slot][row][col], p.wt + (size_t)(kbase + row) * p.ldw + k0n + col, true);
            }
        }
    };

    // ---- register tile: thread (tx, ty) owns pixels {j*TX*4 + tx*4 + 0..3}
    //      and channels {j*TY*4 + ty*4 + 0..3}
    const int tx = tid % T::TX;
    const int ty = tid / T::TX;

    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;

    auto write_out = [&](const float (&tile)[TM][TN], bool add) {
        write_tile<BM, BN, BK, TM, TN, NHWC>(p, tile, add, m0, k0n, tx, ty);
    };

    // Two-level summation (MW_DIRECT_FLUSH_TERMS > 0): every MW_DIRECT_FLUSH_TERMS reduction
    // terms a thread adds its register tile into its own output elements and starts again from
    // zero, because a float32 chain's relative error grows like sqrt(terms) * 2^-24
    // (megawino.direct.config.flush_terms picks the layers).  Each output element belongs to
    // one thread and the order of the additions is fixed, so results are deterministic.
    // run_chunk: one software-pipelined pass over k-tiles [c0, c1) into acc.
    auto run_chunk = [&](int c0, int c1) {
        // Prologue: STAGES - 1 tiles in flight.  One commit group per tile (empty past
        // the end) keeps "wait until STAGES - 2 groups are pending" meaning "tile kt landed".
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) {
            if (c0 + s < c1) load_tile(c0 + s, s);
            mw::cp_async_commit();
        }
        int slot = 0;
        for (int kt = c0; kt < c1; ++kt) {
            mw::cp_async_wait<STAGES - 2>();
            // Tile kt is visible to all threads, and every thread is done with the slot
            // the next copy overwrites (read in iteration kt - 1).
            __syncthreads();
            const int ahead = kt + STAGES - 1;
            if (ahead < c1) load_tile(ahead, slot == 0 ? STAGES - 1 : slot - 1);
            mw::cp_async_commit();
#pragma unroll
            for (int kk = 0; kk < BK; ++kk) {
                float a[TM], b[TN];
#pragma unroll
                for (int j = 0; j < TM / 4; ++j) {
                    const float4 v = *reinterpret_cast<const float4*>(&As[slot][kk][j * T::TX * 4 + tx * 4]);
                    a[4 * j + 0] = v.x; a[4 * j + 1] = v.y; a[4 * j + 2] = v.z; a[4 * j + 3] = v.w;
                }
#pragma unroll
                for (int j = 0; j < TN / 4; ++j) {
                    const float4 v = *reinterpret_cast<const float4*>(&Bs[slot][kk][j * T::TY * 4 + ty * 4]);
                    b[4 * j + 0] = v.x; b[4 * j + 1] = v.y; b[4 * j + 2] = v.z; b[4 * j + 3] = v.w;
                }
#pragma unroll
                for (int i = 0; i < TM; ++i)
#pragma unroll
                    for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
            }
            slot = slot == STAGES - 1 ? 0 : slot + 1;
        }
        mw::cp_async_wait<0>();
        __syncthreads();   // the next chunk's prologue refills the ring
    };

    if constexpr (MW_DIRECT_FLUSH_TERMS > 0) {
        constexpr int FLUSH_KTILES = MW_DIRECT_FLUSH_TERMS / BK;
        static_assert(FLUSH_KTILES >= 1, "MW_DIRECT_FLUSH_TERMS must be 0 or >= BK");
        for (int c0 = 0; c0 < p.ktiles; c0 += FLUSH_KTILES) {
            run_chunk(c0, min(p.ktiles, c0 + FLUSH_KTILES));
            write_out(acc, c0 > 0);
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;
        }
    } else {
        run_chunk(0, p.ktiles);
        write_out(acc, false);
    }
}

// Writes (add == false) or adds into (add == true) the thread's TM x TN outputs.
template <int BM, int BN, int BK, int TM, int TN, bool NHWC>
__device__ __forceinline__ void write_tile(const Params& p, const float (&acc)[TM][TN], bool add,
                                           int m0, int k0n, int tx, int ty) {
    using T = Tile<BM, BN, BK, TM, TN, NHWC>;
    // The flush calls this inside the k-loop: its address math must not be hoisted there.
    mw::opaque(m0, k0n, tx, ty);
    const int P = p.OH * p.OW;
    const bool y_aligned = (reinterpret_cast<unsigned long long>(p.y) & 15ull) == 0;
    // body(j, k) for each output channel k < K of the thread, j its column of acc.
    auto for_each_channel = [&](auto&& body) {
#pragma unroll
        for (int jn = 0; jn < TN / 4; ++jn)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const int k = k0n + jn * T::TY * 4 + ty * 4 + q;
                if (k < p.K) body(4 * jn + q, k);
            }
    };
    if constexpr (!NHWC) {
        // y[n][k][pix]: four consecutive pixels of a thread are contiguous when they
        // lie in one image; with P % 4 == 0 and m % 4 == 0 they always do.
        const bool vec = y_aligned && (P % 4 == 0);
#pragma unroll
        for (int jm = 0; jm < TM / 4; ++jm) {
            const int mb = m0 + jm * T::TX * 4 + tx * 4;
            if (vec) {
                if (mb < p.M) {
                    const int n = mb / P;
                    const int pix = mb - n * P;
                    for_each_channel([&](int j, int k) {
                        const float4 v = make_float4(acc[4 * jm + 0][j], acc[4 * jm + 1][j], acc[4 * jm + 2][j],
                                                     acc[4 * jm + 3][j]);
                        float4* dst = reinterpret_cast<float4*>(p.y + ((size_t)(n * p.K + k) * P + pix));
                        if (add) {
                            const float4 o = *dst;
                            *dst = make_float4(o.x + v.x, o.y + v.y, o.z + v.z, o.w + v.w);
                        } else {
                            *dst = v;
                        }
                    });
                }
            } else {
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const int m = mb + r;
                    if (m < p.M) {
                        const int n = m / P;
                        const int pix = m - n * P;
                        for_each_channel([&](int j, int k) {
                            float* dst = p.y + ((size_t)(n * p.K + k) * P + pix);
                            *dst = add ? *dst + acc[4 * jm + r][j] : acc[4 * jm + r][j];
                        });
                    }
                }
            }
        }
    } else {
        // y[m][k]: four consecutive channels of a thread are contiguous.
        const bool vec = y_aligned && (p.K % 4 == 0);
#pragma unroll
        for (int jm = 0; jm < TM / 4; ++jm)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int m = m0 + jm * T::TX * 4 + tx * 4 + r;
                if (m < p.M) {
#pragma unroll
                    for (int jn = 0; jn < TN / 4; ++jn) {
                        const int kb = k0n + jn * T::TY * 4 + ty * 4;
                        if (vec) {
                            if (kb < p.K) {
                                float4 v = make_float4(acc[4 * jm + r][4 * jn + 0], acc[4 * jm + r][4 * jn + 1],
                                                       acc[4 * jm + r][4 * jn + 2], acc[4 * jm + r][4 * jn + 3]);
                                float4* dst = reinterpret_cast<float4*>(p.y + ((size_t)m * p.K + kb));
                                if (add) {
                                    const float4 o = *dst;
                                    v = make_float4(o.x + v.x, o.y + v.y, o.z + v.z, o.w + v.w);
                                }
                                *dst = v;
                            }
                        } else {
#pragma unroll
                            for (int q = 0; q < 4; ++q)
                                if (kb + q < p.K) {
                                    float* dst = p.y + ((size_t)m * p.K + kb + q);
                                    *dst = add ? *dst + acc[4 * jm + r][4 * jn + q] : acc[4 * jm + r][4 * jn + q];
                                }
                        }
                    }
                }
            }
    }
}

}  // namespace mw_direct
