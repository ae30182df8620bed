"""The BLAS threads of the CPU executor.

The executor runs a layer as thousands of small matrix products (one per GEMM task, in ticket
order).  A multi-threaded BLAS splits each of them across its thread pool, and on a machine whose
cores are busy with other work every product waits for the slowest thread: on a shared 2-core
machine ``megawino sweep resnet50 --batch 1`` took 4.1 and 10.6 s with OpenBLAS's default two
threads, 2.3 and 3.3 s with one (``sweep vgg16 --batch 1``: 26.6 s against 17.3 s).  The executor's products are too small to gain from more.
"""
from __future__ import annotations

import contextlib

EXECUTOR_BLAS_THREADS = 1


@contextlib.contextmanager
def executor_blas_threads():
    """BLAS (OpenBLAS, MKL, BLIS: whichever NumPy loaded) limited to the executor's threads
    inside the block, restored after it."""
    from threadpoolctl import threadpool_limits
    with threadpool_limits(limits=EXECUTOR_BLAS_THREADS, user_api="blas"):
        yield
