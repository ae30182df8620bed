"""Per-shape choice of the fastest algorithm, measured once per shape and GPU and kept in the
user's cache directory (never inside the installed package).

The cache file is ``<cache dir>/algo_choice.json`` (cache dir: ``$MEGAWINO_CACHE_DIR``, else
``$XDG_CACHE_HOME/megawino``, else ``~/.cache/megawino``), written atomically.  A shape is
timed with CUDA events on the current stream: every candidate runs once to warm up, then
``ROUNDS`` rounds time a burst of ``BURST`` back-to-back calls of each candidate in turn, and
the medians of the time per call decide.  ``$MEGAWINO_CHOICE_TIMING=gpu`` times each burst behind
a spin kernel that outlasts its enqueue, so only the GPU's time counts (as in a forward captured
into a CUDA graph, where no host time is left); such choices are kept under their own keys.
"""
from __future__ import annotations

import json
import os
import pathlib
import threading
import time

import numpy as np

from .nvrtc import cupy_module
from .identity import device_name as gpu_name
from ..core import json_files
from ..core.user_files import cache_dir, write_text_atomically

ROUNDS = 7
BURST = 4
ENV_TIMING = "MEGAWINO_CHOICE_TIMING"
TIMINGS = ("burst", "gpu")
FILE_NAME = "algo_choice.json"
FORMAT = "megawino-algo-choice-2"

_lock = threading.Lock()
_memory: dict = {}          # (gpu name, key) -> choice
_loaded: set = set()


def _path() -> pathlib.Path:
    return cache_dir() / FILE_NAME


def _read_file(path: pathlib.Path) -> dict:
    try:
        data = json_files.read_json(path, "choice cache")
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        return {}          # an unreadable cache only costs a new measurement
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("gpus"), dict):
        return {}
    return data["gpus"]


def _load(gpu: str) -> None:
    if gpu in _loaded:
        return
    entries = _read_file(_path()).get(gpu, {})
    if isinstance(entries, dict):
        for key, value in entries.items():
            if isinstance(value, dict) and isinstance(value.get("choice"), str):
                _memory.setdefault((gpu, key), value["choice"])
    _loaded.add(gpu)


def _store(gpu: str, key: str, choice: str, times_us: dict) -> None:
    path = _path()
    try:
        gpus = _read_file(path)
        gpus.setdefault(gpu, {})[key] = {"choice": choice, "median_us": times_us}
        write_text_atomically(path, json.dumps({"format": FORMAT, "gpus": gpus}, indent=1, sort_keys=True))
    except OSError:
        pass                # a read-only home keeps the choice for this process only


def cached_choice(key: str) -> str | None:
    gpu = gpu_name()
    with _lock:
        _load(gpu)
        return _memory.get((gpu, key))


def timing() -> str:
    """How choices are timed: ``$MEGAWINO_CHOICE_TIMING`` (one of TIMINGS), else "burst"."""
    value = os.environ.get(ENV_TIMING, "burst")
    if value not in TIMINGS:
        raise ValueError(f"{ENV_TIMING} must be one of {', '.join(TIMINGS)}, got {value!r}")
    return value


def choose_fastest(key: str, candidates: dict, handicaps: dict | None = None) -> str:
    """The name of the fastest zero-argument callable of ``candidates`` for ``key`` on this GPU:
    the cached answer, else measured now (and cached).  ``handicaps``: name -> factor (>= 1) its
    measured time is multiplied by before the comparison (the file keeps the measured times).
    While the current stream is captured into a CUDA graph nothing can be timed: the first
    candidate is returned then."""
    if not candidates:
        raise ValueError("choose_fastest needs at least one candidate")
    if not isinstance(key, str) or not key:
        raise ValueError(f"key must be a non-empty string, got {key!r}")
    names = list(candidates)
    gpu_time = timing() == "gpu"
    key = key + "/gpu-time" if gpu_time else key
    cached = cached_choice(key)
    if cached in candidates:
        return cached
    if len(names) == 1:
        return names[0]
    from .workspace import is_capturing
    if is_capturing():
        return names[0]
    handicaps = handicaps or {}
    times = measure(candidates, gpu_time=gpu_time)
    choice = min(times, key=lambda name: times[name] * handicaps.get(name, 1.0))
    gpu = gpu_name()
    with _lock:
        _memory[(gpu, key)] = choice
        _store(gpu, key, choice, {n: round(t, 2) for n, t in times.items()})
    return choice


def measure(candidates: dict, rounds: int = ROUNDS, calls: int = BURST, gpu_time: bool = False) -> dict:
    """Median microseconds per call of each candidate, timed with CUDA events in alternating
    rounds; each sample is a burst of ``calls`` back-to-back calls, so the host time of a call
    counts only where it exceeds the GPU's (as inside a model, where the host runs ahead).
    ``gpu_time``: each burst is queued behind a spin kernel twice as long as the host took to
    queue a burst, so the GPU runs it back to back and the host's time does not count."""
    from .timing import gpu_spin
    cupy = cupy_module()
    stream = cupy.cuda.get_current_stream()
    for fn in candidates.values():
        fn()
    spin_ns = 0
    if gpu_time:
        stream.synchronize()
        host_s = 0.0
        for fn in candidates.values():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            host_s = max(host_s, time.perf_counter() - t0)
        spin_ns = int(2e9 * host_s) + 20_000
    samples = {name: [] for name in candidates}
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    for _ in range(rounds):
        for name, fn in candidates.items():
            if spin_ns:
                gpu_spin(spin_ns)
            start.record(stream)
            for _ in range(calls):
                fn()
            end.record(stream)
            end.synchronize()
            samples[name].append(cupy.cuda.get_elapsed_time(start, end) * 1e3 / calls)
    return {name: float(np.median(v)) for name, v in samples.items()}


def forget() -> None:
    """Drop the in-memory choices (the file stays)."""
    with _lock:
        _memory.clear()
        _loaded.clear()
