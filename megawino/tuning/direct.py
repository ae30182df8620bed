"""The direct path's tuner: measure the model's top-ranked direct-convolution configs on the GPU.

``tune_layers(specs, top=12, budget_s=280)`` ranks each layer's candidates with
:func:`megawino.direct.rank`, compiles and times the ``top`` best with CUDA
events (kernel only: packed filters, gather table and output are prepared once),
keeps the fastest, and writes the user's ``<cache>/direct_<gpu>.json`` (merged with what is
there; :mod:`megawino.core.user_files`), which :func:`megawino.direct.heuristic_config` reads
before the shipped ``mapping/direct_<gpu>.json``.  A rich progress
bar shows the layer and the candidate; past ``budget_s`` the remaining layers keep
the model's first choice, unmeasured.

Command line (one network's non-3x3 layers, or a suite of layers.json)::

    python -m megawino.tuning.direct --network resnet50 --batch 64
    python -m megawino.tuning.direct --suite direct --batch 64 --top 12 --budget 280
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Callable, Iterable

from .. import direct   # through the package, as callers see it (megawino.direct.<name>)
from ..core.spec import LayerSpec
from ..core.json_files import read_json
from ..core.user_files import check_writable, write_text_atomically
from ..direct.config import DirectConfig, parse_direct_table

__all__ = ["measure_config", "tune_layers", "layers_for", "main"]


def _inputs(spec: LayerSpec, seed: int = 0):
    import cupy

    rng = cupy.random.default_rng(seed)
    x = rng.standard_normal(spec.input_shape, dtype=cupy.float32)
    w = rng.standard_normal(spec.weight_shape, dtype=cupy.float32)
    return x, w


def measure_config(spec: LayerSpec, cfg: DirectConfig, data=None, warmup: int = 2,
                   min_reps: int = 3, max_reps: int = 50, target_s: float = 0.05) -> float:
    """Median kernel time in microseconds (CUDA events) of one config on one layer."""
    import cupy

    nhwc = spec.layout == "NHWC"
    flush = direct.flush_terms(spec)
    if data is None:
        data = _prepare(spec)
    x, wt, table, y = data
    kern = direct.compile_kernel(cfg, nhwc, flush)
    for _ in range(warmup):
        direct.launch(kern, cfg, spec, x, wt, table, y)
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    direct.launch(kern, cfg, spec, x, wt, table, y)
    stop.record()
    stop.synchronize()
    first_ms = cupy.cuda.get_elapsed_time(start, stop)
    reps = int(min(max_reps, max(min_reps, target_s * 1e3 / max(first_ms, 1e-3))))
    times = []
    for _ in range(reps):
        start.record()
        direct.launch(kern, cfg, spec, x, wt, table, y)
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) * 1e3)
    times.sort()
    return times[len(times) // 2]


def _prepare(spec: LayerSpec):
    import cupy

    x, w = _inputs(spec)
    wt = direct.pack_weights(w, spec.layout, xp=cupy)
    table = direct._device_table(spec)
    y = cupy.empty(spec.output_shape, dtype=cupy.float32)
    return x, wt, table, y


def _default_out(gpu: str) -> Path:
    """The user's tuned direct table (the shipped ``mapping/direct_<gpu>.json`` is read-only)."""
    from ..core.user_files import user_table_path

    return user_table_path(f"direct_{gpu}.json")


def _entries_for_update(path: Path) -> dict:
    """The entries of the direct table at ``path`` ({} without a file); a file there that is not
    a direct table is a ValueError, so the tuner never overwrites it."""
    if not path.exists():
        return {}
    try:
        data = read_json(path, "JSON direct-config table")
        parse_direct_table(data, path)
    except (OSError, UnicodeDecodeError, ValueError) as err:
        reason = str(err).removeprefix(f"{path}: ")
        raise ValueError(f"not overwriting {path}: it is not a megawino direct table ({reason}); "
                         f"pass another --out") from None
    return data["entries"]


def tune_layers(specs: Iterable[LayerSpec], top: int = 12, budget_s: float = 280.0,
                out: str | Path | None = None, gpu: str | None = None,
                measure: Callable[[LayerSpec, DirectConfig], float] | None = None,
                progress: bool = True, write: bool = True) -> dict:
    """Measure the ``top`` model-ranked configs of each distinct layer; return and
    (``write``) save ``{"gpu", "entries": {mapping_key: {...}}}``.

    ``out`` defaults to the user's tuned table (``<cache>/direct_<gpu>.json``,
    megawino.core.user_files); it is written atomically, only when a config was measured, and a
    file there that is not a direct table, or a place that cannot be written, is a ValueError
    before anything is measured.
    ``measure(spec, cfg) -> microseconds`` replaces the GPU timing (tests use it)."""
    specs = list(dict.fromkeys(s.with_(name="") for s in specs))   # distinct shapes
    if gpu is None:
        gpu = direct._current_gpu() if measure is None else "test"
    path = Path(out) if out is not None else _default_out(gpu)
    old = _entries_for_update(path) if write else {}
    if write:
        check_writable(path)            # before the budget is spent, not after
    if measure is None:
        cache: dict = {}

        def measure(spec, cfg):
            if spec not in cache:
                cache.clear()
                cache[spec] = _prepare(spec)
            return measure_config(spec, cfg, cache[spec])

    entries: dict[str, dict] = {}
    t0 = time.perf_counter()
    plans = [(spec, direct.rank(spec, top=top)) for spec in specs]
    total = sum(len(r) for _, r in plans)

    def run(advance: Callable[[str], None]) -> None:
        for spec, ranked in plans:
            results = []
            for cfg, predicted in ranked:
                if time.perf_counter() - t0 > budget_s:
                    advance("")                     # out of time: leave this layer to the model
                    continue
                advance(f"{spec.describe()}  {cfg.key}")
                try:
                    us = float(measure(spec, cfg))
                except Exception as err:   # a config that fails to compile or launch
                    us = math.inf
                    print(f"megawino.tuning.direct: {spec.describe()} {cfg.key} failed: {err}")
                results.append((us, cfg, predicted))
            if not results or all(math.isinf(item[0]) for item in results):
                continue
            best_us, best_cfg, best_pred = min(results, key=lambda item: item[0])
            entries[direct.mapping_key(spec)] = {
                "config": best_cfg.key,
                "us": round(best_us, 3),
                "predicted_us": round(best_pred, 3),
                "tflops": round(spec.direct_flops / best_us / 1e6, 3),
                "measured": [{"config": c.key, "us": None if math.isinf(u) else round(u, 3),
                              "predicted_us": round(p, 3)} for u, c, p in results],
            }

    if progress:
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn)

        with Progress(TextColumn("direct tune"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), TextColumn("{task.description}")) as bar:
            task = bar.add_task("", total=total)

            def advance(desc: str) -> None:
                bar.update(task, advance=1, description=desc)

            run(advance)
    else:
        run(lambda desc: None)

    table = {"gpu": gpu, "entries": entries}
    if write and entries:               # measured nothing: nothing written
        merged = {"gpu": gpu, "entries": {**old, **entries}}
        parse_direct_table(merged, path)
        write_text_atomically(path, json.dumps(merged, indent=1, sort_keys=True) + "\n")
        direct._load_mapping_cached.cache_clear()
        table["path"] = str(path)
    table["elapsed_s"] = round(time.perf_counter() - t0, 2)
    return table


def layers_for(network: str | None = None, suite: str | None = None, batch: int = 64,
               layout: str = "NCHW") -> list[LayerSpec]:
    """Non-3x3-stride-1 layers of a network, or every layer of a suite."""
    if network:
        from ..core.networks import network_layers

        return [layer.spec for layer in network_layers(network, batch, winograd_only=False,
                                                       layout=layout)
                if not layer.spec.winograd_eligible]
    from ..core.suite import load_suite

    return load_suite(suite=suite or "direct", batch=batch, layout=layout)


def main(argv=None) -> int:
    """The command line; exit 0 with a table written, 1 when nothing could be measured (no file
    written), 2 for bad arguments or an output that cannot be written (one line on stderr)."""
    from ..core.arguments import positive_float, positive_int

    parser = argparse.ArgumentParser(prog="python -m megawino.tuning.direct",
                                     description="tune the direct-convolution configs on this GPU")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--network", help="a network of megawino.core.networks (its non-3x3 layers)")
    group.add_argument("--suite", default=None, help="a suite of layers.json (default: direct)")
    parser.add_argument("--batch", type=positive_int, default=64)
    parser.add_argument("--layout", default="NCHW", choices=("NCHW", "NHWC"))
    parser.add_argument("--top", type=positive_int, default=12,
                        help="configs measured per layer, best by the model first (the model's "
                             "ranking is not sharp enough for a shorter list)")
    parser.add_argument("--budget", type=positive_float, default=280.0, help="seconds")
    parser.add_argument("--out", default=None,
                        help="JSON path (default: direct_<gpu>.json in $MEGAWINO_CACHE_DIR, else "
                             "$XDG_CACHE_HOME/megawino, else ~/.cache/megawino); written only when "
                             "a config was measured")
    args = parser.parse_args(argv)
    from ..gpu.call_checks import require_gpu
    try:
        specs = layers_for(args.network, args.suite, args.batch, args.layout)
        if args.out is not None:
            check_writable(args.out)
        require_gpu()
        table = tune_layers(specs, top=args.top, budget_s=args.budget, out=args.out)
    except ValueError as err:
        parser.exit(2, f"{parser.prog}: error: {' '.join(str(err).split())}\n")
    except RuntimeError as err:          # no GPU: nothing can be measured
        parser.exit(1, f"{parser.prog}: error: {' '.join(str(err).split())}; no table written\n")
    if not table["entries"]:
        parser.exit(1, f"{parser.prog}: error: measured nothing (every config failed or the budget "
                       "ran out before the first); no table written\n")
    for key, entry in table["entries"].items():
        print(f"{key:32s} {entry['config']:26s} {entry['us']} us  {entry['tflops']} TFLOP/s "
              f"(model {entry['predicted_us']} us)")
    print(f"wrote {table.get('path')} in {table['elapsed_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
