"""Per-shape choice of the fastest algorithm, measured once per shape and GPU and kept in the
user's cache directory (never inside the installed package).

The cache file is ``<cache dir>/algo_choice.json`` (cache dir: ``$MEGAWINO_CACHE_DIR``, else
``$XDG_CACHE_HOME/megawino``, else ``~/.cache/megawino``), written atomically.  A shape is
timed with CUDA events on the current stream: every candidate runs once to warm up, then
``ROUNDS`` rounds time a burst of ``BURST`` back-to-back calls of each candidate in turn, and
the medians of the time per call decide.
"""
from __future__ import annotations

import json
import pathlib
import threading

import numpy as np

from .nvrtc import cupy_module
from ..tuning.table import device_name as gpu_name
from ..core.user_files import cache_dir, write_text_atomically

ROUNDS = 7
BURST = 4
FILE_NAME = "algo_choice.json"
FORMAT = "megawino-algo-choice-2"

_lock = threading.Lock()
_memory: dict = {}          # (gpu name, key) -> choice
_loaded: set = set()


def _path() -> pathlib.Path:
    return cache_dir() / FILE_NAME


def _read_file(path: pathlib.Path) -> dict:
    try:
        data = json.loads(path.read_text())
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
    cached = cached_choice(key)
    if cached in candidates:
        return cached
    if len(names) == 1:
        return names[0]
    from .workspace import is_capturing
    if is_capturing():
        return names[0]
    handicaps = handicaps or {}
    times = measure(candidates)
    choice = min(times, key=lambda name: times[name] * handicaps.get(name, 1.0))
    gpu = gpu_name()
    with _lock:
        _memory[(gpu, key)] = choice
        _store(gpu, key, choice, {n: round(t, 2) for n, t in times.items()})
    return choice


def measure(candidates: dict, rounds: int = ROUNDS, calls: int = BURST) -> dict:
    """Median microseconds per call of each candidate, timed with CUDA events in alternating
    rounds; each sample is a burst of ``calls`` back-to-back calls, so the host time of a call
    counts only where it exceeds the GPU's (as inside a model, where the host runs ahead)."""
    cupy = cupy_module()
    stream = cupy.cuda.get_current_stream()
    for fn in candidates.values():
        fn()
    samples = {name: [] for name in candidates}
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    for _ in range(rounds):
        for name, fn in candidates.items():
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
