"""The CPU entry points keep their buffers within their memory budget: a large image runs in
bands of output rows (the output of the whole-image run), a layer that cannot fit is refused
with the size and the budget before anything is allocated. Allocations are measured (peak RSS
in a fresh process, tracemalloc here), never seconds."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap
import tracemalloc

import numpy as np
import pytest

import megawino
from megawino.core.spec import LayerSpec
from megawino.core.winograd import direct_conv_nchw, rel_l2
from megawino.cpu import executor

REPO = pathlib.Path(__file__).resolve().parents[2]
MiB = 1 << 20

# A fresh process runs conv2d_cpu with the arithmetic of each task skipped (the buffers are
# allocated and poisoned, so touched, as in a run) and reports its peak RSS before and after;
# an address-space limit of input + output + budget + slack beyond what it holds at the start
# turns an unbounded allocation into a MemoryError instead of exhausting the machine.
PEAK_RSS = textwrap.dedent("""
    import json, resource, sys
    import numpy as np
    from megawino.cpu import executor
    shape, k, padding = json.loads(sys.argv[1])
    executor.run_task = lambda *args: None
    x = np.ones(shape, np.float32)
    w = np.ones((k, shape[1], 3, 3), np.float32)
    out_bytes = 4 * k * (shape[2] + 2 * padding - 2) * (shape[3] + 2 * padding - 2)
    with open("/proc/self/status") as fh:
        vm = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmSize:"))
    limit = vm + out_bytes + executor.DEFAULT_MEMORY_BUDGET + (512 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    y = executor.conv2d_cpu(x, w, padding=padding)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"base": base, "peak": peak, "output": y.nbytes, "input": x.nbytes}))
""")


def _peak_rss(shape, k, padding):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", PEAK_RSS, json.dumps([shape, k, padding])],
                          capture_output=True, text=True, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def _record_band_bytes(monkeypatch) -> list:
    """The bytes each executor call holds (its input band and its buffers), recorded as it runs."""
    seen = []
    real = executor.execute

    def spy(graph, order, xb, wb):
        seen.append(4 * xb.size + executor.buffer_bytes(graph.layout))
        return real(graph, order, xb, wb)

    monkeypatch.setattr(executor, "execute", spy)
    return seen


@pytest.mark.parametrize("shape, k, padding", [
    ((1, 3, 4096, 4096), 4, 1),          # one image's whole buffers: about 3 GiB
    ((1, 3, 8192, 8192), 4, 1),          # whole buffers 12 GiB, run in 1 GiB bands
    ((1, 1, 16, 16), 1, 4000),           # a 1 KB input whose padding makes an 8014x8014 output
])
def test_large_image_stays_within_the_budget(shape, k, padding):
    """Peak RSS grows by at most the output, the budget and a little (graphs, band copies)."""
    found = _peak_rss(list(shape), k, padding)
    grown = found["peak"] - found["base"]
    assert grown <= found["output"] + executor.DEFAULT_MEMORY_BUDGET + 64 * MiB, found


def test_8192_image_plan_fits_the_budget():
    """A 1x3x8192x8192 K=4 image (its whole buffers: 12 GiB) runs in bands that each fit 1 GiB,
    as computed from the sizes (nothing is allocated)."""
    spec = LayerSpec(1, 3, 4, 8192, 8192)
    whole = executor.buffer_bytes(executor._batch_layout(spec, 1, None, 4))
    assert whole > 8 * executor.DEFAULT_MEMORY_BUDGET
    tracemalloc.start()
    rows = executor.rows_per_band(spec)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 16 * MiB and rows % 4 == 0 and 4 <= rows < spec.out_h
    assert executor.band_bytes(spec, rows) <= executor.DEFAULT_MEMORY_BUDGET
    assert executor.band_bytes(spec, rows + 4) > executor.DEFAULT_MEMORY_BUDGET


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("n, c, k, h, w, padding, m", [
    (2, 5, 7, 37, 23, 1, 4), (1, 3, 4, 19, 11, 3, 2), (1, 1, 2, 21, 6, 0, 4), (2, 2, 3, 41, 30, 2, 4)])
def test_bands_give_the_whole_image_output(monkeypatch, layout, n, c, k, h, w, padding, m):
    """Bands of whole tile rows compute the whole image's tiles: the same output, bit for bit;
    each band within the budget; the output close to a float64 reference."""
    spec = LayerSpec(n, c, k, h, w, padding=padding, layout=layout)
    rng = np.random.default_rng(5)
    x = rng.standard_normal(spec.input_shape, dtype=np.float32)
    wt = rng.standard_normal(spec.weight_shape, dtype=np.float32)
    whole = megawino.conv2d_cpu(x, wt, padding=padding, layout=layout, m=m)
    budget = executor.band_bytes(spec, min(m, spec.out_h), None, m)     # one row of tiles
    assert executor.buffer_bytes(executor._batch_layout(spec, 1, None, m)) > budget
    seen = _record_band_bytes(monkeypatch)
    banded = megawino.conv2d_cpu(x, wt, padding=padding, layout=layout, m=m, memory_budget=budget)
    assert len(seen) == n * -(-spec.out_h // m) and max(seen) <= budget
    assert np.array_equal(banded, whole)
    x64 = (x if layout == "NCHW" else x.transpose(0, 3, 1, 2)).astype(np.float64)
    y64 = banded if layout == "NCHW" else banded.transpose(0, 3, 1, 2)
    assert 0 < rel_l2(y64, direct_conv_nchw(x64, wt.astype(np.float64), 1, padding)) < 1e-5


def test_what_cannot_fit_is_refused_before_allocating():
    """Even one row of tiles over the budget: a ValueError stating both sizes, with next to
    nothing allocated (traced)."""
    x = np.ones((1, 64, 8, 4096), np.float32)
    w = np.ones((64, 64, 3, 3), np.float32)
    tracemalloc.start()
    with pytest.raises(ValueError, match=r"needs \d+\.\d MiB .* memory budget of 1\.0 MiB"):
        megawino.conv2d_cpu(x, w, memory_budget=MiB)
    with pytest.raises(ValueError, match=r"need \d+\.\d MiB, more than the memory budget of 1\.0 MiB"):
        megawino.conv2d_cpu(x, w, memory_budget=MiB, order=[0])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 4 * MiB



@pytest.mark.parametrize("entry", ["conv2d", "conv2d_cpu", "torch"])
def test_every_cpu_entry_point_keeps_the_budget(monkeypatch, entry):
    """megawino.conv2d on NumPy arrays and megawino.torch with backend="cpu" run conv2d_cpu
    with its default budget: an image over it runs in bands that each fit."""
    spec = LayerSpec(1, 3, 4, 40, 36)
    budget = executor.band_bytes(spec, 8)
    monkeypatch.setattr(executor, "DEFAULT_MEMORY_BUDGET", budget)
    assert executor.buffer_bytes(executor._batch_layout(spec, 1, None, 4)) > budget
    seen = _record_band_bytes(monkeypatch)
    rng = np.random.default_rng(9)
    x = rng.standard_normal(spec.input_shape, dtype=np.float32)
    w = rng.standard_normal(spec.weight_shape, dtype=np.float32)
    if entry == "torch":
        torch = pytest.importorskip("torch")
        import megawino.torch as mwt
        y = mwt.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1, backend="cpu").numpy()
    else:
        y = getattr(megawino, entry)(x, w, padding=1)
    assert len(seen) >= 2 and max(seen) <= budget
    assert 0 < rel_l2(y.astype(np.float64), direct_conv_nchw(x.astype(np.float64), w.astype(np.float64), 1, 1)) < 1e-5
