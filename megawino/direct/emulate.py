"""A NumPy emulation of the direct kernel, thread by thread.

:func:`emulate_direct` runs the kernel's tile loop on the CPU in float64 with the
same index math, predicates, shared-memory layout and epilogue; the tests run it
against the float64 reference for random shapes and every config shape.  It fills
the shared-memory tiles tile by tile (two buffers); the kernel's cp.async ring of
``DirectConfig.stages`` slots holds the same tile contents, only earlier.
"""
from __future__ import annotations

import numpy as np

from .config import DirectConfig, flush_terms, structural_ok
from .kernel import _spec_from, build_table, outside_taps, pack_weights, vector_x
from .model import heuristic_config


# ---------------------------------------------------------------------------
# NumPy emulation of the kernel, thread by thread (index math, predicates, tiles)
# ---------------------------------------------------------------------------

class EmulationError(RuntimeError):
    """The emulated kernel broke one of its own rules (a read out of bounds, a misaligned vector,
    an output written other than once per chunk): a kernel bug the tests must see."""


def _check(ok, what: str) -> None:
    # an exception, not assert: the checks are the emulator's purpose and must hold under -O
    if not ok:
        raise EmulationError(what)

def emulate_direct(x: np.ndarray, w: np.ndarray, stride=1, padding=0,
                   layout: str = "NCHW", config: DirectConfig | None = None,
                   check_writes: bool = True, flush: int | None = None) -> np.ndarray:
    """Run the kernel's exact tile loop on the CPU in float64: the same table, the
    same packed filters, the same per-thread load/store indices, smem layout
    (with poisoned padding), register tile and epilogue (vector and scalar
    stores, the chunked flush).  Output unwritten elements are NaN; ``check_writes``
    checks every output element is written exactly once per reduction chunk.
    ``flush`` overrides :func:`flush_terms` (0: one chain)."""
    spec = _spec_from(x.shape, w.shape, stride, padding, layout)
    cfg = config or heuristic_config(spec)
    nhwc = layout == "NHWC"
    flush = flush_terms(spec) if flush is None else flush
    if not structural_ok(cfg, nhwc):
        raise ValueError(f"config {cfg.key} is not valid for {layout}")
    xf = np.ascontiguousarray(x, dtype=np.float64).reshape(-1)
    wt = pack_weights(np.asarray(w, dtype=np.float64), layout)
    ldw = wt.shape[1]
    wtf = wt.reshape(-1)
    table = build_table(spec)
    C, H, W, K = spec.C, spec.H, spec.W, spec.K
    OH, OW = spec.out_h, spec.out_w
    P = OH * OW
    M = spec.N * P
    crs = C * spec.R * spec.S
    ktiles = -(-crs // cfg.BK)
    BM, BN, BK, TM, TN = cfg.BM, cfg.BN, cfg.BK, cfg.TM, cfg.TN
    T, TX, TY = cfg.threads, cfg.TX, cfg.TY
    A_ELEMS, A_PER = BM * BK, cfg.a_per
    B_VECS, B_PER = BN * BK // 4, cfg.b_per
    LDA, LDB = BM + 4, BN + 4
    y = np.full(M * K, np.nan)
    writes = np.zeros(M * K, dtype=np.int64)
    tid = np.arange(T)
    tx, ty = tid % TX, tid // TX
    vec_x = vector_x(spec, 0)     # a NumPy array counts as 16-byte aligned

    def pixel_info(m):
        m = np.asarray(m)
        n = m // P
        pix = m - n * P
        oy, ox = pix // OW, pix % OW
        iy0 = oy * spec.stride_h - spec.pad_h
        ix0 = ox * spec.stride_w - spec.pad_w
        base = ((n * H + iy0) * W + ix0) * C if nhwc else (n * C * H + iy0) * W + ix0
        valid = m < M
        outside = np.where(valid, outside_taps(iy0, ix0, spec), np.uint32(0xFFFFFFFF))
        return np.where(valid, base, 0), outside

    for bx in range(-(-M // BM)):
        m0 = bx * BM
        if nhwc:
            minfo = pixel_info(m0 + np.arange(BM))
        else:
            mine = pixel_info(m0 + tid % BM)
            quad = tid % (BM // 4)
            first = m0 + 4 * quad
            x_quad = np.where(first < M, (first // P) * C * P + first % P, -1)
        for by in range(-(-K // BN)):
            k0n = by * BN
            As = np.full((2, BK, LDA), np.nan)
            Bs = np.full((2, BK, LDB), np.nan)
            acc = np.zeros((T, TM, TN))

            def load_global(kt):
                """The tile's copies: (krow, col, value) of x per thread and copy, and wt rows."""
                kbase = kt * BK
                a_writes = []
                if vec_x:                     # Params::vec_x: 4 pixels of one x row per copy
                    for i in range(-(-A_ELEMS // 4 // T)):
                        e = tid + i * T
                        ok = e < A_ELEMS // 4
                        krow = e // (BM // 4)
                        inside = ok & (x_quad >= 0) & (kbase + krow < C)
                        for q in range(4):
                            vals = np.zeros(T)
                            addr = x_quad + (kbase + krow) * P + q
                            if np.any(inside):
                                _check(addr[inside].max() < xf.size, "input read out of bounds")
                            vals[inside] = xf[addr[inside]]
                            a_writes.append((krow[ok], 4 * quad[ok] + q, vals[ok]))
                for i in range(0 if vec_x else A_PER):
                    e = tid + i * T
                    ok = e < A_ELEMS
                    if nhwc:
                        krow = e % BK
                        mloc = np.minimum(e // BK, BM - 1)
                        base, outside = (arr[mloc] for arr in minfo)
                        col = e // BK
                    else:
                        krow = e // BM
                        base, outside = mine
                        col = e % BM
                    krow = np.where(ok, krow, 0)
                    t = table[kbase + krow]            # IndexError = out-of-bounds table read
                    inb = ok & ((t[:, 1].view(np.uint32) & outside) == 0)
                    addr = base + t[:, 0]
                    if np.any(inb):
                        a = addr[inb]
                        _check(a.min() >= 0 and a.max() < xf.size, "input read out of bounds")
                    vals = np.zeros(T)
                    vals[inb] = xf[addr[inb]]
                    a_writes.append((krow[ok], col[ok], vals[ok]))
                b_reg = np.zeros((T, B_PER, 4))
                b_ok = np.zeros((T, B_PER), dtype=bool)
                for j in range(B_PER):
                    e = tid + j * T
                    ok = e < B_VECS
                    row = e // (BN // 4)
                    col = (e % (BN // 4)) * 4
                    for q in range(4):
                        addr = (kbase + row[ok]) * ldw + k0n + col[ok] + q
                        _check(addr.size == 0 or addr.max() < wtf.size, "filter read out of bounds")
                        _check(np.all((k0n + col[ok]) % 4 == 0), "filter read not 16-byte aligned")
                        b_reg[ok, j, q] = wtf[addr]
                    b_ok[:, j] = ok
                return a_writes, b_reg, b_ok

            def store_shared(buf, regs):
                a_writes, b_reg, b_ok = regs
                for krow, col, vals in a_writes:
                    As[buf, krow, col] = vals
                for j in range(B_PER):
                    e = (tid + j * T)[b_ok[:, j]]
                    row = e // (BN // 4)
                    col = (e % (BN // 4)) * 4
                    for q in range(4):
                        Bs[buf, row, col + q] = b_reg[b_ok[:, j], j, q]

            a_cols = np.concatenate([j * TX * 4 + tx[:, None] * 4 + np.arange(4)[None, :]
                                     for j in range(TM // 4)], axis=1)      # (T, TM)
            b_cols = np.concatenate([j * TY * 4 + ty[:, None] * 4 + np.arange(4)[None, :]
                                     for j in range(TN // 4)], axis=1)      # (T, TN)
            _check(a_cols.max() < BM and b_cols.max() < BN, "shared-memory fragment out of its tile")

            def run_chunk(c0, c1):
                store_shared(0, load_global(c0))
                for kt in range(c0, c1):
                    buf = (kt - c0) & 1
                    more = kt + 1 < c1
                    regs = load_global(kt + 1) if more else None
                    for kk in range(BK):
                        a = As[buf, kk][a_cols]
                        b = Bs[buf, kk][b_cols]
                        acc[...] += a[:, :, None] * b[:, None, :]
                    if more:
                        store_shared(buf ^ 1, regs)

            def put(addr, values, add):
                if add:
                    y[addr] += values
                else:
                    y[addr] = values
                np.add.at(writes, addr, 1)

            def write_out(add):
                if not nhwc:
                    vec = P % 4 == 0
                    for jm in range(TM // 4):
                        mb = m0 + jm * TX * 4 + tx * 4
                        for jn in range(TN // 4):
                            for q in range(4):
                                k = k0n + jn * TY * 4 + ty * 4 + q
                                for r4 in range(4):
                                    m = mb + r4
                                    if vec:
                                        ok = (mb < M) & (k < K)
                                        n = mb // P
                                        pix = mb - n * P + r4
                                        _check(np.all(((n * K + k) * P + (pix - r4))[ok] % 4 == 0), "vector store not 16-byte aligned")
                                    else:
                                        ok = (m < M) & (k < K)
                                        n = m // P
                                        pix = m - n * P
                                    put(((n * K + k) * P + pix)[ok], acc[ok, 4 * jm + r4, 4 * jn + q], add)
                else:
                    vec = K % 4 == 0
                    for jm in range(TM // 4):
                        for r4 in range(4):
                            m = m0 + jm * TX * 4 + tx * 4 + r4
                            for jn in range(TN // 4):
                                kb = k0n + jn * TY * 4 + ty * 4
                                for q in range(4):
                                    ok = (m < M) & ((kb < K) if vec else (kb + q < K))
                                    put((m * K + kb + q)[ok], acc[ok, 4 * jm + r4, 4 * jn + q], add)

            if flush:
                for c0 in range(0, ktiles, flush // BK):
                    run_chunk(c0, min(ktiles, c0 + flush // BK))
                    write_out(c0 > 0)
                    acc[...] = 0.0
            else:
                run_chunk(0, ktiles)
                write_out(False)
    if check_writes:
        chunks = -(-ktiles // (flush // BK)) if flush else 1
        _check(writes.min() == chunks and writes.max() == chunks, "output not written exactly once per chunk")
    if nhwc:
        return y.reshape(spec.N, OH, OW, K)
    return y.reshape(spec.N, K, OH, OW)
