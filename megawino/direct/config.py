"""Tile configurations of the direct kernel, the parameter space and the resource filter.

* :class:`DirectConfig`: the tile parameters (block tile BM x BN x BK, register
  tile TM x TN, ``min_blocks`` of ``__launch_bounds__``), compile-time constants;
* :class:`Hardware`: what the model and the filter know of the GPU (:data:`H100`);
* the parameter space (:data:`GRID`, :func:`all_configs`, :func:`candidate_configs`)
  and the resource filter (:func:`resource_ok`: threads, registers, shared memory,
  no spills).  Registers and spills come from the ptxas reports of every config in
  the space, compiled for sm_90: ``mapping/direct_ptxas_sm90.json``, read once on
  first use (:func:`ptxas_table`); ``python -m megawino.direct --ptxas`` rewrites it.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import pathlib
import re

from ..core.resources import mapping_dir
from ..core.spec import LayerSpec, parse_shape
from ..core.tasks import round_up
from ..tuning.table import check_object

# Tap bits of the gather table (direct_conv.cuh): filter row r is bit r, column s is bit
# TAP_COL_BIT + s, TAP_SENTINEL marks table rows past C*R*S (every pixel treats it as outside).
TAP_COL_BIT = 15
TAP_SENTINEL = 1 << 31
MAX_FILTER = TAP_COL_BIT   # largest R and S the tap bits can describe
INT32_LIMIT = 2**31 - 2**24   # element count limit of x and y (32-bit offsets in the kernel)
PACK_ROWS = 16           # CRS is padded to a multiple of this (every BK divides it)
PACK_COLS = 128          # K is padded to a multiple of this (every BN divides it)
FLUSH_TERMS = 512        # reduction terms per partial sum when flushing (MW_DIRECT_FLUSH_TERMS)
FLUSH_MIN_CRS = 2048     # flush only when C*R*S exceeds this
MAX_STAGES = 4           # deepest cp.async ring (MW_DIRECT_STAGES)
STAGE_SMEM_BUDGET = 40 * 1024   # static shared memory the ring may use (the static limit is 48 KB)


def flush_terms(spec: LayerSpec) -> int:
    """MW_DIRECT_FLUSH_TERMS for a layer.  One float32 FMA chain of n terms of zero-mean data
    has a relative L2 error near 0.30 * 2^-24 * sqrt(n), which up to FLUSH_MIN_CRS terms stays
    under 1e-6 with a margin; above it the kernel sums chunks of FLUSH_TERMS and adds the chunk
    sums into y.  A flush costs a pipeline drain and a read-modify-write of the block's
    outputs, so it is used only where the error needs it (the measurements behind both are in
    docs/experiments.md)."""
    return FLUSH_TERMS if spec.C * spec.R * spec.S > FLUSH_MIN_CRS else 0


# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, order=True)
class DirectConfig:
    """Tile parameters of one compiled direct kernel."""

    BM: int = 128         # output pixels per block
    BN: int = 128         # output channels per block
    BK: int = 8           # reduction slab per pipeline stage
    TM: int = 8           # pixels per thread (multiple of 4)
    TN: int = 8           # channels per thread (multiple of 4)
    min_blocks: int = 1   # __launch_bounds__ min blocks per SM (caps registers)

    @property
    def TX(self) -> int:
        return self.BM // self.TM

    @property
    def TY(self) -> int:
        return self.BN // self.TN

    @property
    def threads(self) -> int:
        return self.TX * self.TY

    @property
    def a_per(self) -> int:
        return -(-(self.BM * self.BK) // self.threads)

    @property
    def b_per(self) -> int:
        return -(-(self.BN * self.BK // 4) // self.threads)

    @property
    def stage_bytes(self) -> int:
        """Shared memory of one ring slot: a BK x (BM + 4) slab of x and BK x (BN + 4) of wt."""
        return self.BK * ((self.BM + 4) + (self.BN + 4)) * 4

    @property
    def stages(self) -> int:
        """Depth of the cp.async ring: as many slots as fit STAGE_SMEM_BUDGET, 2 to MAX_STAGES."""
        return max(2, min(MAX_STAGES, STAGE_SMEM_BUDGET // self.stage_bytes))

    def smem_bytes(self, nhwc: bool = False) -> int:
        """Static shared memory, as in ``Tile::SMEM_BYTES``."""
        return self.stages * self.stage_bytes + (self.BM * 16 if nhwc else 0)

    @property
    def key(self) -> str:
        return (f"bm{self.BM}bn{self.BN}bk{self.BK}tm{self.TM}tn{self.TN}"
                f"mb{self.min_blocks}")

    @classmethod
    def from_key(cls, key: str) -> "DirectConfig":
        m = re.fullmatch(r"bm(\d+)bn(\d+)bk(\d+)tm(\d+)tn(\d+)mb(\d+)", key)
        if not m:
            raise ValueError(f"not a direct config key: {key!r}")
        return cls(*map(int, m.groups()))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "DirectConfig":
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: int(v) for k, v in data.items() if k in fields})

    def defines(self, nhwc: bool, flush: int = 0) -> tuple[str, ...]:
        return (f"-DMW_DIRECT_FLUSH_TERMS={int(flush)}", f"-DMW_DIRECT_BM={self.BM}", f"-DMW_DIRECT_BN={self.BN}",
                f"-DMW_DIRECT_BK={self.BK}", f"-DMW_DIRECT_TM={self.TM}",
                f"-DMW_DIRECT_TN={self.TN}", f"-DMW_DIRECT_NHWC={int(bool(nhwc))}",
                f"-DMW_DIRECT_MINBLOCKS={self.min_blocks}", f"-DMW_DIRECT_STAGES={self.stages}",
                f"-DMW_DIRECT_TAP_COL_BIT={TAP_COL_BIT}", f"-DMW_DIRECT_TAP_SENTINEL={TAP_SENTINEL:#x}u")


GRID = {"BM": (32, 64, 128), "BN": (32, 64, 128), "BK": (8, 16), "TM": (4, 8), "TN": (4, 8),
        "min_blocks": (1, 2)}

DEFAULT_CONFIG = DirectConfig(128, 128, 8, 8, 8, 2)


@dataclasses.dataclass(frozen=True)
class Hardware:
    """What the model and the resource filter know of the GPU."""

    name: str = "h100"
    sms: int = 132
    clock_hz: float = 1.755e9
    ffma_lanes: int = 128            # FP32 lanes per SM (4 schedulers x 32)
    issue_per_clk: int = 4           # warp instructions per clock per SM
    regs_per_sm: int = 65536
    regs_per_thread: int = 255
    smem_per_sm: int = 228 * 1024
    smem_static_per_block: int = 48 * 1024
    smem_reserved_per_block: int = 1024
    threads_per_sm: int = 2048
    threads_per_block: int = 1024
    blocks_per_sm: int = 32
    dram_bw: float = 2.97e12         # bytes/s, measured copy
    l2_bw: float = 5.5e12            # bytes/s, L2 -> SMs
    l2_bytes: int = 50 * 2**20
    smem_bytes_per_clk: int = 128    # per SM
    global_latency_clk: int = 900
    smem_latency_clk: int = 32
    launch_us: float = 3.0


H100 = Hardware()


# ---------------------------------------------------------------------------
# Tuned tables (mapping/direct_<gpu>.json and the user's): schema
# ---------------------------------------------------------------------------

NHWC_KEY_SUFFIX = "_nhwc"   # a table key is the layer's shape string, plus this for NHWC layers
DIRECT_TABLE_FIELDS = {"gpu": str, "entries": dict}
DIRECT_ENTRY_FIELDS = {"config": str, "us": float, "predicted_us": float, "tflops": float,
                       "measured": list}
DIRECT_MEASURED_FIELDS = {"config": str, "us": float, "predicted_us": float}


def table_config(key: str) -> DirectConfig:
    """A config key of a table (``bm64bn64bk8tm4tn4mb1``) within the parameter space's bounds."""
    cfg = DirectConfig.from_key(key)
    for field, values in GRID.items():
        value = getattr(cfg, field)
        if not 1 <= value <= max(values):
            raise ValueError(f"config {key!r}: {field} = {value} is outside 1..{max(values)}")
    return cfg


def parse_direct_table(data, source) -> dict[str, DirectConfig]:
    """Layer key -> DirectConfig of a direct table, or a one-line ValueError naming ``source``
    (the file) and the entry: known keys only, a shape-string key (optionally ``_nhwc``), a
    config key within GRID's bounds, numbers where the tuner writes numbers."""
    try:
        check_object(data, DIRECT_TABLE_FIELDS, ("entries",), "table")
        out = {}
        for key, entry in data["entries"].items():
            where = f"entry {key!r}"
            check_object(entry, DIRECT_ENTRY_FIELDS, ("config",), where)
            for i, item in enumerate(entry.get("measured", [])):
                check_object(item, DIRECT_MEASURED_FIELDS, ("config",), f"{where}: 'measured'[{i}]",
                              nullable=("us",))
            try:
                parse_shape(key.removesuffix(NHWC_KEY_SUFFIX))
                for item in entry.get("measured", []):
                    table_config(item["config"])
                out[key] = table_config(entry["config"])
            except ValueError as err:
                raise ValueError(f"{where}: {err}") from None
        return out
    except ValueError as err:
        raise ValueError(f"{source}: {err}") from None


def structural_ok(cfg: DirectConfig, nhwc: bool = False) -> bool:
    """The static_asserts of ``Tile`` in direct_conv.cuh."""
    BM, BN, BK, TM, TN = cfg.BM, cfg.BN, cfg.BK, cfg.TM, cfg.TN
    if min(BM, BN, BK, TM, TN) < 1 or cfg.min_blocks < 1:
        return False
    if BM % TM or BN % TN or TM % 4 or TN % 4 or BM % 4 or BN % 4:
        return False
    if BN > PACK_COLS or PACK_COLS % BN or BK > PACK_ROWS or PACK_ROWS % BK:
        return False
    t = cfg.threads
    if t % 32 or t > 1024:
        return False
    if nhwc:
        return t % BK == 0
    return t % BM == 0 and (BM * BK) % t == 0


# ---------------------------------------------------------------------------
# ptxas table and resource filter
# ---------------------------------------------------------------------------

PTXAS_TABLE = "direct_ptxas_sm90.json"


def ptxas_table_path() -> pathlib.Path:
    return mapping_dir() / PTXAS_TABLE


@functools.lru_cache(maxsize=1)
def ptxas_table() -> dict[str, tuple[int, int, int]]:
    """ptxas (``-arch=sm_90``) on cuda/direct.cu for every structurally valid config of
    GRID, both layouts, with and without the flush ("f" suffix): key (:func:`_ptxas_key`)
    -> (registers, spill bytes (stack + stores + loads), static smem bytes).  Read once
    from ``mapping/direct_ptxas_sm90.json``; regenerate with ``python -m megawino.direct --ptxas``."""
    with open(ptxas_table_path(), encoding="utf-8") as fh:
        data = json.load(fh)
    return {key: tuple(int(v) for v in value) for key, value in data["entries"].items()}


def _ptxas_key(cfg: DirectConfig, nhwc: bool, flush: int = 0) -> str:
    return cfg.key + ("nhwc" if nhwc else "nchw") + ("f" if flush else "")


def estimate_registers(cfg: DirectConfig, nhwc: bool = False, flush: int = 0) -> int:
    """Registers per thread: the ptxas report when the config was compiled here,
    else an estimate (accumulators + fragments + prefetch + addressing)."""
    hit = ptxas_table().get(_ptxas_key(cfg, nhwc, flush))
    if hit is not None:
        return hit[0]
    est = cfg.TM * cfg.TN + cfg.TM + cfg.TN + cfg.a_per * (2 if nhwc else 1) + 4 * cfg.b_per + 36
    cap = min(255, (65536 // (cfg.threads * cfg.min_blocks)) // 8 * 8)
    return min(est, cap) if est <= 255 else est


def _spills(cfg: DirectConfig, nhwc: bool, flush: int = 0) -> int:
    hit = ptxas_table().get(_ptxas_key(cfg, nhwc, flush))
    if hit is not None:
        return hit[1]
    est = cfg.TM * cfg.TN + cfg.TM + cfg.TN + cfg.a_per * (2 if nhwc else 1) + 4 * cfg.b_per + 36
    cap = min(255, (65536 // (cfg.threads * cfg.min_blocks)) // 8 * 8)
    return 0 if est <= cap else 4 * (est - cap)


def resource_ok(cfg: DirectConfig, nhwc: bool = False, hw: Hardware = H100,
                regs: int | None = None, flush: int = 0) -> bool:
    """Threads, registers, shared memory within the limits; no register spills
    (ptxas report of this config, layout and flush build)."""
    if not structural_ok(cfg, nhwc):
        return False
    t = cfg.threads
    if t > hw.threads_per_block or t * cfg.min_blocks > hw.threads_per_sm:
        return False
    if cfg.smem_bytes(nhwc) > hw.smem_static_per_block:
        return False
    if cfg.min_blocks * (cfg.smem_bytes(nhwc) + hw.smem_reserved_per_block) > hw.smem_per_sm:
        return False
    r = estimate_registers(cfg, nhwc, flush) if regs is None else regs
    if r > hw.regs_per_thread or _alloc_regs(r) * t > hw.regs_per_sm:
        return False
    if regs is None and _spills(cfg, nhwc, flush) > 0:
        return False
    if _alloc_regs(r) * t * cfg.min_blocks > hw.regs_per_sm:
        return False
    return True


def _alloc_regs(regs: int) -> int:
    return -(-regs // 8) * 8


def occupancy(cfg: DirectConfig, nhwc: bool = False, hw: Hardware = H100, flush: int = 0) -> int:
    """Resident blocks per SM (registers, shared memory, threads, block limit)."""
    t = cfg.threads
    r = _alloc_regs(estimate_registers(cfg, nhwc, flush))
    by_regs = hw.regs_per_sm // (r * t)
    by_smem = hw.smem_per_sm // (cfg.smem_bytes(nhwc) + hw.smem_reserved_per_block)
    by_threads = hw.threads_per_sm // t
    return max(0, min(by_regs, by_smem, by_threads, hw.blocks_per_sm))


def all_configs() -> list[DirectConfig]:
    """Every point of GRID; ``min_blocks=2`` only where it changes the register cap
    (256 threads or more: below that, 65536 / (2 * threads) >= 255 anyway)."""
    keys = list(GRID)
    out = []
    for values in itertools.product(*GRID.values()):
        cfg = DirectConfig(**dict(zip(keys, values)))
        if cfg.min_blocks > 1 and 65536 // (cfg.min_blocks * cfg.threads) >= 255:
            continue
        out.append(cfg)
    return out


def candidate_configs(spec: LayerSpec, hw: Hardware = H100) -> list[DirectConfig]:
    """Configs of the space that pass the resource filter for this layer's layout,
    minus those whose block tile is grossly larger than the problem (a BN of 128
    for K = 3, say: dominated by a smaller tile with the same work)."""
    nhwc = spec.layout == "NHWC"
    flush = flush_terms(spec)
    M = spec.N * spec.out_h * spec.out_w
    out = []
    for cfg in all_configs():
        if not resource_ok(cfg, nhwc, hw, flush=flush):
            continue
        if cfg.BN > 32 and cfg.BN >= 2 * round_up(spec.K, 32):
            continue
        if cfg.BM > 32 and cfg.BM >= 2 * round_up(M, 32):
            continue
        out.append(cfg)
    return out
