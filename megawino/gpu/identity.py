"""Which GPU this is: its table key, compute capability and architecture family, and the
ceilings (DRAM bandwidth, SM count, GEMM rate) the simulator's cost model starts from.

* :func:`gpu_key`: a device name -> the key of its tables (``mapping/<key>.json``):
  ``"NVIDIA H100 80GB HBM3"`` -> ``h100``, ``"NVIDIA H100 PCIe"`` -> ``h100-pcie``,
  ``"NVIDIA GH200 480GB"`` -> ``gh200``; names of no known pattern -> a file-safe slug.
* :class:`GpuIdentity`: name, key, compute capability (CuPy's string, ``"90"``) and family
  (``sm_90``: one SM design, so one architecture's tuned entries are a sound start for another
  GPU of it).  :func:`current_identity` reads the current device; without one,
  :data:`DEFAULT_TARGET` (the H100 the shipped tables were first tuned on) stands in, so that
  offline tools (``megawino mapping``) show what that GPU would run.
* :func:`family_fallbacks`: the tables of the same family, nearest in memory bandwidth first.
* :func:`ceilings`: a measured record where one exists (:data:`MEASURED_CEILINGS`), else one
  derived from the device's attributes.

Whether the GEMM runs on warpgroup MMAs (wgmma) or mma.sync is a property of the compute
capability, not of the name: :data:`ARCH_SPECIFIC_TARGETS` lists the capabilities the kernels
are built for with an architecture-specific target (megawino.gpu.nvrtc.arch_options; sm_90a:
wgmma); every other capability compiles the mma.sync GEMM (cuda/params.cuh MW_GEMM_WGMMA).

Nothing here touches CUDA at import time.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import re

from ..core.ceilings import MEASURED_CEILINGS, Ceilings

# Compute capabilities whose architecture-specific target the kernels are built for: sm_90a has
# the warpgroup MMAs (wgmma) the GEMM uses there (sm_100's tensor cores take other instructions).
ARCH_SPECIFIC_TARGETS = {"90": "sm_90a"}

# Known GPUs: key -> (compute capability, nominal DRAM bytes/s from the vendor's data sheet).
# The bandwidth orders a family's tables (nearest first); the capability names the family of a
# GPU whose device is absent (a table key alone).
KNOWN_GPUS = {
    "h100": ("90", 3.35e12), "h100-pcie": ("90", 2.0e12), "h100-nvl": ("90", 3.9e12),
    "h800": ("90", 3.35e12), "h200": ("90", 4.8e12), "gh200": ("90", 4.0e12), "h20": ("90", 4.0e12),
    "a100": ("80", 2.0e12), "a800": ("80", 2.0e12), "a30": ("80", 0.93e12),
    "a10": ("86", 0.6e12), "a40": ("86", 0.7e12), "l4": ("89", 0.3e12), "l40": ("89", 0.86e12),
    "l40s": ("89", 0.86e12), "b200": ("100", 8.0e12), "gb200": ("100", 8.0e12),
}
# Name suffixes of another board of the same chip (other memory, clocks or SM count).
BOARD_SUFFIXES = ("pcie", "nvl")


def gpu_key(device_name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100', 'NVIDIA H100 PCIe' -> 'h100-pcie', 'NVIDIA GH200 480GB'
    -> 'gh200'; unknown names -> a file-safe slug."""
    upper = device_name.upper()
    match = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", upper)
    if match:
        key = match.group(1).lower()
        words = re.findall(r"[A-Z0-9]+", upper[match.end():])
        board = next((w.lower() for w in words if w.lower() in BOARD_SUFFIXES), None)
        return f"{key}-{board}" if board else key
    return re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-") or "unknown"


@dataclasses.dataclass(frozen=True)
class GpuIdentity:
    """One GPU as the tables and the runtime see it."""

    name: str                       # the device's name ('' for a table key without a device)
    key: str                        # its tables' key (gpu_key)
    capability: str | None          # compute capability, CuPy's string ("90"); None: unknown
    sms: int | None = None          # multiprocessors (device attribute)
    nominal_bytes_per_s: float | None = None   # DRAM bandwidth from the memory clock and bus width
    clock_hz: float | None = None   # SM clock (device attribute)

    @property
    def family(self) -> str | None:
        """The architecture family, ``sm_<capability>`` (None when the capability is unknown)."""
        return f"sm_{self.capability}" if self.capability else None

    @property
    def gemm_engine(self) -> str:
        """How the Winograd GEMM multiplies on this GPU: ``wgmma`` where the kernels are built for
        an architecture-specific target with warpgroup MMAs (sm_90a), else ``mma.sync``."""
        return "wgmma" if self.capability in ARCH_SPECIFIC_TARGETS else "mma.sync"

    def describe(self) -> str:
        name = self.name or self.key
        return f"{name} (key {self.key}, {self.family or 'unknown architecture'}, GEMM on {self.gemm_engine})"


def identity_for_key(key: str) -> GpuIdentity:
    """The identity of table key ``key`` without a device (capability from KNOWN_GPUS)."""
    capability, nominal = KNOWN_GPUS.get(key, (None, None))
    return GpuIdentity(name="", key=key, capability=capability, nominal_bytes_per_s=nominal)


def identity_of(name: str, capability: str | None, sms: int | None = None,
                nominal_bytes_per_s: float | None = None, clock_hz: float | None = None) -> GpuIdentity:
    """The identity of a device named ``name`` of compute capability ``capability``."""
    key = gpu_key(name)
    if nominal_bytes_per_s is None:
        nominal_bytes_per_s = KNOWN_GPUS.get(key, (None, None))[1]
    return GpuIdentity(name=name, key=key, capability=None if capability is None else str(capability),
                       sms=sms, nominal_bytes_per_s=nominal_bytes_per_s, clock_hz=clock_hz)


# Without a device: the GPU the shipped tables were first tuned on.
DEFAULT_TARGET = identity_for_key("h100")


def device_name() -> str:
    """The current CUDA device's name ('' without CuPy or a device)."""
    try:
        import cupy
        name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    except Exception:   # no CuPy, driver or device
        return ""
    return name.decode() if isinstance(name, bytes) else str(name)


def current_identity() -> GpuIdentity:
    """The current device's identity, or :data:`DEFAULT_TARGET` without one."""
    name = device_name()
    if not name:
        return DEFAULT_TARGET
    import cupy
    return _device_identity(cupy.cuda.Device().id, name)


@functools.lru_cache(maxsize=16)
def _device_identity(device_id: int, name: str) -> GpuIdentity:
    """The identity of device ``device_id`` (read once: every plan asks)."""
    import cupy
    device = cupy.cuda.Device(device_id)
    attrs = device.attributes
    # Memory clock (kHz) x 2 transfers per clock x bus width (bits) / 8.
    nominal = 2.0 * attrs.get("MemoryClockRate", 0) * 1e3 * attrs.get("GlobalMemoryBusWidth", 0) / 8
    return identity_of(name, device.compute_capability, sms=int(attrs["MultiProcessorCount"]),
                       nominal_bytes_per_s=nominal or None,
                       clock_hz=attrs.get("ClockRate", 0) * 1e3 or None)


def current_gpu_key(default: str = DEFAULT_TARGET.key) -> str:
    """Key of this machine's GPU tables; ``default`` without a GPU."""
    name = device_name()
    return gpu_key(name) if name else default


def family_fallbacks(identity: GpuIdentity, keys) -> list[str]:
    """The keys among ``keys`` (GPUs with tables) of ``identity``'s family, other than its own:
    nearest in nominal memory bandwidth first (the tuned task sizes follow how memory-bound a
    layer is), ties and unknown bandwidths in the order of ``keys``."""
    if identity.family is None:
        return []
    siblings = [k for k in keys if k != identity.key and identity_for_key(k).family == identity.family]

    def distance(k):
        mine, theirs = identity.nominal_bytes_per_s, KNOWN_GPUS[k][1]
        return abs(math.log(mine / theirs)) if mine else 0.0
    return sorted(siblings, key=distance)


# The share of its nominal bandwidth a copy reaches on the H100: the estimate for a GPU
# without a measured record.
COPY_FRACTION = MEASURED_CEILINGS["h100"].bytes_per_s / KNOWN_GPUS["h100"][1]
REFERENCE_CLOCK_HZ = 1.98e9     # the H100 SXM's boost clock, at which its GEMM rate was measured


def ceilings(identity: GpuIdentity) -> Ceilings:
    """The ceilings of ``identity``: its measured record, else derived from the device's
    attributes (SMs; nominal bandwidth x the H100's copy fraction; the H100's GEMM rate per SM
    and clock), else the H100's."""
    record = MEASURED_CEILINGS.get(identity.key)
    if record is not None:
        return dataclasses.replace(record, sms=identity.sms or record.sms)
    ref = MEASURED_CEILINGS[DEFAULT_TARGET.key]
    if not (identity.sms or identity.nominal_bytes_per_s):
        return ref
    sms = identity.sms or ref.sms
    clock = identity.clock_hz / REFERENCE_CLOCK_HZ if identity.clock_hz else 1.0
    flops = ref.flops_per_s * sms / ref.sms * clock
    nbytes = identity.nominal_bytes_per_s * COPY_FRACTION if identity.nominal_bytes_per_s else ref.bytes_per_s
    return Ceilings(flops, nbytes, sms, identity.name or identity.key,
                    "derived from the device's attributes (SMs, clock, memory clock and bus width)")
