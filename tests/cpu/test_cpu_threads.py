"""The CPU executor runs its small matrix products on one BLAS thread (megawino/cpu/threads.py)
and gives the process its BLAS threads back afterwards."""
from __future__ import annotations

import numpy as np
import pytest

threadpoolctl = pytest.importorskip("threadpoolctl")

from megawino.core.spec import LayerSpec  # noqa: E402
from megawino.core.task_sizes import build_graph, default_params  # noqa: E402
from megawino.core.winograd import direct_conv_nchw, rel_l2  # noqa: E402
from megawino.cpu import executor, threads  # noqa: E402
from megawino.schedule import mapping  # noqa: E402


def _blas_threads() -> list[int]:
    return [pool["num_threads"] for pool in threadpoolctl.threadpool_info() if pool["user_api"] == "blas"]


def test_executor_runs_on_its_blas_threads_and_restores_them(monkeypatch):
    if not _blas_threads():
        pytest.skip("NumPy loaded no BLAS that threadpoolctl controls")
    spec = LayerSpec(2, 16, 24, 11, 9)
    graph = build_graph(spec, default_params(spec))
    order = mapping.build_interleaved(graph, mapping.MappingParams()).order
    rng = np.random.default_rng(7)
    x = rng.standard_normal(spec.input_shape, dtype=np.float32)
    w = rng.standard_normal(spec.weight_shape, dtype=np.float32)
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        before = _blas_threads()
        seen = []
        run_task = executor.run_task

        def recording(*args, **kwargs):
            seen.append(tuple(_blas_threads()))
            return run_task(*args, **kwargs)

        monkeypatch.setattr(executor, "run_task", recording)
        y = executor.execute(graph, order, x, w).y
        assert _blas_threads() == before                    # given back
    assert seen and set(seen) == {(threads.EXECUTOR_BLAS_THREADS,) * len(before)}
    assert rel_l2(y, direct_conv_nchw(x, w, 1, 1)) < 1e-5


def test_blas_threads_restored_when_a_task_fails(monkeypatch):
    if not _blas_threads():
        pytest.skip("NumPy loaded no BLAS that threadpoolctl controls")
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        before = _blas_threads()
        with pytest.raises(RuntimeError, match="boom"):
            with threads.executor_blas_threads():
                assert _blas_threads() == [threads.EXECUTOR_BLAS_THREADS] * len(before)
                raise RuntimeError("boom")
        assert _blas_threads() == before
