"""How ``megawino tune`` splits its time budget over the layers: every layer it starts gets at
least its *minimum* (its seeds and the confirmation, megawino.tuning.search), so a run that runs
out of time leaves whole layers untouched rather than half-tuned ones falling back to guesses.

* :func:`minimum_s` estimates a layer's minimum up front: one measurement is a plan (graph and
  ticket order built on the host, about :data:`HOST_S_PER_TASK` a task) plus warm-up and timed
  runs of the layer, whose time is estimated from the GPU's ceilings (the roofline of its bytes
  and its Winograd GEMM's products, times :data:`ROOFLINE_SLACK`).
* :class:`Schedule` hands out deadlines: before each layer it drops (``skipped``) the layers
  with the largest minimum until every layer left fits, then gives this one its minimum and a
  share of the spare time in proportion to its minimum.  When a layer overruns its share, the
  estimates of the layers after it are scaled up by the overrun.
"""
from __future__ import annotations

import dataclasses
import time

from ..core.spec import LayerSpec
from ..core.task_sizes import default_params
from ..core.tasks import Layout

HOST_S_PER_TASK = 5e-6        # building a candidate's graph and ticket order, per task
PLAN_S = 0.05                 # a plan's fixed cost (allocation, upload)
SETUP_S = 1.0                 # the layer's rotated inputs, first compile
ROOFLINE_SLACK = 2.5          # layer time / roofline estimate: the roofline ignores latency and waits
WINOGRAD_GEMM_FLOPS = 0.25    # F(4x4,3x3): 36 products per 16 outputs instead of 144
WARMUP = 3
CONFIRM_CONFIGS = 4           # heuristic, sequential, winner, current choice
CONFIRM_ROUNDS = 3


def layer_us(spec: LayerSpec, ceilings) -> float:
    """Estimated time of one run of the layer (us) on a GPU of ``ceilings``."""
    roofline = max(spec.min_bytes / ceilings.bytes_per_s,
                   spec.direct_flops * WINOGRAD_GEMM_FLOPS / ceilings.flops_per_s)
    return ROOFLINE_SLACK * roofline * 1e6


def measurement_s(spec: LayerSpec, ceilings, reps: int) -> float:
    """Estimated seconds of one measured candidate (its plan, warm-up and timed runs)."""
    tasks = Layout(spec, default_params(spec)).num_tasks
    return PLAN_S + HOST_S_PER_TASK * tasks + (WARMUP + reps) * layer_us(spec, ceilings) * 1e-6


def minimum_s(spec: LayerSpec, seeds: int, ceilings, reps: int) -> tuple[float, float]:
    """(the layer's minimum seconds: inputs, heuristic, sequential, ``seeds`` and confirmation;
    the confirmation's share of it)."""
    one = measurement_s(spec, ceilings, reps)
    confirm = CONFIRM_ROUNDS * CONFIRM_CONFIGS * one
    return SETUP_S + (2 + seeds) * one + confirm, confirm


@dataclasses.dataclass(eq=False)
class LayerJob:
    spec: LayerSpec
    seeds: list
    incumbent: tuple | None
    minimum: tuple[float, float]      # minimum_s


class Schedule:
    """Deadlines for ``jobs`` (LayerJob, tuned in order) within ``budget_s`` seconds from now."""

    def __init__(self, jobs, budget_s: float, clock=time.perf_counter):
        self.clock = clock
        self.end = clock() + budget_s
        self.pending = list(jobs)
        self.skipped: list = []
        self.scale = 1.0
        self._started = None

    def _minimum(self, job) -> float:
        return self.scale * job.minimum[0]

    def start(self, job) -> float | None:
        """The deadline of ``job``'s optional part (simulator-ranked candidates), after which
        its confirmation still fits; None: ``job`` is skipped (left untouched)."""
        if job not in self.pending:
            return None
        remaining = self.end - self.clock()
        while self.pending and sum(map(self._minimum, self.pending)) > remaining:
            drop = max(self.pending, key=self._minimum)
            self.pending.remove(drop)
            self.skipped.append(drop)
        if job not in self.pending:
            return None
        total = sum(map(self._minimum, self.pending))
        share = self._minimum(job) + (remaining - total) * self._minimum(job) / total
        self.pending.remove(job)
        now = self.clock()
        self._started = (now, share)
        return now + share - self.scale * job.minimum[1]

    def done(self, job) -> None:
        """Record that ``job`` ended: an overrun of its share scales up the later estimates."""
        began, share = self._started
        took = self.clock() - began
        if took > share > 0:
            self.scale *= took / share
