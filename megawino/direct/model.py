"""The performance model of the direct kernel and the choice of a config per layer.

* a DeepCuts-style model (:func:`predict_us`, terms in :func:`model_terms`):
  issue-bound FFMA efficiency of the register tile, global-load latency against
  the work per k-tile, shared-memory wavefronts, DRAM and L2 bytes given the
  tiling, and wave quantisation / SM imbalance;  :func:`rank` orders the
  candidates of :func:`megawino.direct.config.candidate_configs` by it;
* :func:`heuristic_config`: the tuned entry of ``mapping/direct_<gpu>.json``
  when there is one, else the model's best (no tuning step needed).
"""
from __future__ import annotations

import functools
import math

from ..core.resources import mapping_dir
from ..core.spec import LayerSpec
from ..gpu.identity import gpu_key
from .config import (DEFAULT_CONFIG, H100, NHWC_KEY_SUFFIX, DirectConfig, Hardware, candidate_configs,
                     flush_terms, occupancy, parse_direct_table, resource_ok)
from ..core.tasks import round_up


# ---------------------------------------------------------------------------
# Performance model (upper-bound style, after DeepCuts)
# ---------------------------------------------------------------------------

def _instr_per_ktile(cfg: DirectConfig, nhwc: bool) -> tuple[float, float]:
    """(FFMA, all warp instructions) one thread issues per k-tile."""
    ffma = cfg.TM * cfg.TN * cfg.BK
    lds = (cfg.TM // 4 + cfg.TN // 4) * cfg.BK
    gather = cfg.a_per * (9 + (2 if nhwc else 0))   # table LDG, adds, compares, LDG, STS
    bload = cfg.b_per * 4                            # address, LDG.128, STS.128
    loop = 8                                         # barrier, loop, buffer swap
    return ffma, ffma + lds + gather + bload + loop


def _a_footprint_bytes(spec: LayerSpec, BM: int) -> float:
    """Bytes of input a block of BM consecutive pixels touches (in 32-byte sectors)."""
    OH, OW, P = spec.out_h, spec.out_w, spec.out_h * spec.out_w
    if BM >= P:
        images = min(spec.N, -(-BM // P) + 1)
        return images * spec.C * spec.H * spec.W * 4.0
    rows_out = min(OH, -(-BM // OW) + (1 if BM % OW else 0)) if BM >= OW else (2 if OW % BM else 1)
    cols_out = OW if BM >= OW else BM
    rows_in = min(spec.H, (rows_out - 1) * spec.stride_h + spec.R)
    cols_in = min(spec.W, (cols_out - 1) * spec.stride_w + spec.S)
    if spec.layout == "NCHW":
        row_bytes = (-(-cols_in * 4 // 32) + 1) * 32
        return float(spec.C * rows_in * row_bytes)
    return float(rows_in * cols_in * round_up(spec.C * 4, 32))


def model_terms(spec: LayerSpec, cfg: DirectConfig, hw: Hardware = H100) -> dict:
    """The model's terms (microseconds, and the ratios) for one layer and config."""
    nhwc = spec.layout == "NHWC"
    flush = flush_terms(spec)
    M = spec.N * spec.out_h * spec.out_w
    crs = spec.C * spec.R * spec.S
    mt, nt = -(-M // cfg.BM), -(-spec.K // cfg.BN)
    ktiles = -(-crs // cfg.BK)
    chunks = -(-ktiles // (flush // cfg.BK)) if flush else 1
    blocks = mt * nt
    occ = max(1, occupancy(cfg, nhwc, hw, flush))
    warps = cfg.threads // 32
    ffma, instr = _instr_per_ktile(cfg, nhwc)
    issue_eff = ffma / instr

    # Issue-bound time of one k-tile for the blocks resident on one SM, and the
    # global-load latency it must cover (the next tile's loads are in flight).
    def wave_cycles(resident: int) -> float:
        per_ktile = max(instr * warps * resident / hw.issue_per_clk, hw.global_latency_clk)
        epilogue = cfg.TM * cfg.TN * 2.0 * warps * resident / hw.issue_per_clk
        return ktiles * per_ktile + chunks * (hw.global_latency_clk + epilogue)

    # DeepCuts' SMRatio: the FFMAs between two shared-memory loads, times the warps a
    # scheduler can switch between, must cover the shared-memory latency.
    def sm_ratio(resident: int) -> float:
        ffma_per_lds = cfg.TM * cfg.TN / (cfg.TM // 4 + cfg.TN // 4)
        warps_per_sched = max(1.0, warps * resident / 4)
        return min(1.0, ffma_per_lds * warps_per_sched / hw.smem_latency_clk)

    per_wave = hw.sms * occ
    full_waves, rest = divmod(blocks, per_wave)
    cycles = full_waves * wave_cycles(occ) / sm_ratio(occ)
    if rest:
        resident = -(-rest // hw.sms)
        cycles += wave_cycles(resident) / sm_ratio(resident)
    t_compute = cycles / hw.clock_hz * 1e6

    # Shared memory: wavefronts of the float4 fragment reads (32 lanes per warp).
    tx_lanes = min(cfg.TX, 32)
    a_wf = max(1.0, 16 * tx_lanes / 128)
    b_wf = max(1.0, 16 * max(1, 32 // cfg.TX) / 128)
    wf_per_kk = (cfg.TM // 4) * a_wf + (cfg.TN // 4) * b_wf
    smem_wf = blocks * warps * ktiles * cfg.BK * wf_per_kk
    t_smem = smem_wf * 128 / (hw.smem_bytes_per_clk * hw.sms * hw.clock_hz) * 1e6

    # Global memory: every block reads its input footprint and its filter slab from L2;
    # DRAM sees the input again per channel tile only when it does not fit in L2.
    in_bytes = 4.0 * spec.N * spec.C * spec.H * spec.W
    out_bytes = 4.0 * M * spec.K
    w_bytes = 4.0 * round_up(crs, cfg.BK) * nt * cfg.BN
    a_block = min(_a_footprint_bytes(spec, cfg.BM), 4.0 * cfg.BM * crs)
    l2_bytes = blocks * (a_block + 4.0 * round_up(crs, cfg.BK) * cfg.BN) + out_bytes * (2 * chunks - 1)
    rereads = 1 if in_bytes < 0.6 * hw.l2_bytes else nt
    dram_bytes = in_bytes * rereads + w_bytes + out_bytes
    t_dram = dram_bytes / hw.dram_bw * 1e6
    t_l2 = l2_bytes / hw.l2_bw * 1e6

    total = max(t_compute, t_smem, t_dram, t_l2) + hw.launch_us
    useful = spec.direct_flops
    return {
        "us": total, "compute_us": t_compute, "smem_us": t_smem, "dram_us": t_dram, "l2_us": t_l2,
        "blocks": blocks, "occupancy": occ, "waves": blocks / per_wave, "issue_eff": issue_eff,
        "tile_eff": useful / (2.0 * mt * cfg.BM * nt * cfg.BN * crs),
        "tflops": useful / total / 1e6,
    }


def predict_us(spec: LayerSpec, cfg: DirectConfig, hw: Hardware = H100) -> float:
    """Predicted kernel time (microseconds); ``inf`` when the config cannot run."""
    if not resource_ok(cfg, spec.layout == "NHWC", hw, flush=flush_terms(spec)):
        return math.inf
    return model_terms(spec, cfg, hw)["us"]


def rank(spec: LayerSpec, top: int = 5, hw: Hardware = H100) -> list[tuple[DirectConfig, float]]:
    """The ``top`` candidates by predicted time, fastest first (ties: bigger tiles, then key)."""
    scored = [(predict_us(spec, cfg, hw), cfg) for cfg in candidate_configs(spec, hw)]
    scored.sort(key=lambda item: (round(item[0], 6), -item[1].BM * item[1].BN, item[1].key))
    return [(cfg, us) for us, cfg in scored[:top]]


# ---------------------------------------------------------------------------
# Tuned table and heuristic choice
# ---------------------------------------------------------------------------

gpu_slug = gpu_key   # the direct tables are keyed like the Winograd ones (megawino.tuning.table)


def mapping_key(spec: LayerSpec) -> str:
    return spec.shape_string + ("" if spec.layout == "NCHW" else NHWC_KEY_SUFFIX)


@functools.lru_cache(maxsize=8)
def _load_mapping_cached(path: str, mtime: float) -> dict:
    from ..core.json_files import read_json

    return parse_direct_table(read_json(path, "JSON direct-config table"), path)


def load_mapping(gpu: str = "h100") -> dict[str, DirectConfig]:
    """Tuned choices: ``mapping/direct_<gpu>.json`` (shipped) updated with the user's tuned
    table (``<cache>/direct_<gpu>.json``, megawino.core.user_files); a table that breaks the schema
    is a ValueError naming the file and the entry."""
    from ..core.user_files import user_table_path

    out: dict[str, DirectConfig] = {}
    for path in (mapping_dir() / f"direct_{gpu}.json", user_table_path(f"direct_{gpu}.json")):
        if path.is_file():
            out.update(_load_mapping_cached(str(path), path.stat().st_mtime))
    return out


def heuristic_config(spec: LayerSpec, gpu: str = "h100", hw: Hardware = H100) -> DirectConfig:
    """A config for any layer without a tuning step: the tuned table's entry when
    there is one (and it passes the filter), else the model's best candidate."""
    nhwc = spec.layout == "NHWC"
    tuned = load_mapping(gpu).get(mapping_key(spec))
    if tuned is not None and resource_ok(tuned, nhwc, hw, flush=flush_terms(spec)):
        return tuned
    best = rank(spec, top=1, hw=hw)
    if best:
        return best[0][0]
    return DEFAULT_CONFIG   # unreachable for the shipped space; resource_ok-checked in tests
