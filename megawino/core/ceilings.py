"""Measured ceilings of the GPUs megawino has been measured on: what the simulator's roofline
(megawino.schedule.simulator.CostModel) starts from before its calibration on traces absorbs
the rest.  megawino.gpu.identity.ceilings picks a GPU's record, or derives one from the
device's attributes where there is none."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Ceilings:
    flops_per_s: float      # the Winograd GEMM's product rate on the default arithmetic (3xTF32)
    bytes_per_s: float      # DRAM bandwidth a copy reaches
    sms: int
    device: str             # the GPU these are, as the CLI says it
    source: str             # how they were obtained


# Measured ceilings per GPU key (megawino.gpu.identity.gpu_key).
MEASURED_CEILINGS = {
    "h100": Ceilings(51.3e12, 2.97e12, 132, "H100 SXM",
                     "measured on the H100 SXM (copy bandwidth; the 3xTF32 GEMM's rate)"),
    # The H100's SM and clocks, so the H100's GEMM rate; its own copy bandwidth.
    "h200": Ceilings(51.3e12, 4.27e12, 132, "H200 SXM",
                     "measured on the H200 SXM (copy bandwidth; the GEMM rate is the H100's, the same SM)"),
}
