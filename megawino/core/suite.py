"""The benchmark suite file: where it is, its layers as :class:`~megawino.core.spec.LayerSpec`,
and picking layers of it by name.  The suite ships with the package
(``megawino/data/suite_layers.json``); another file can be passed as a path or through
``$MEGAWINO_SUITE``."""
from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Sequence

from .json_files import read_json
from .spec import LayerSpec

__all__ = ["suite_path", "load_suite", "select_specs", "SHIPPED_SUITE"]

SHIPPED_SUITE = "suite_layers.json"      # in the megawino.data package


def suite_path(path: str | os.PathLike | None = None):
    """Where the suite file is: ``path`` if given, else ``$MEGAWINO_SUITE``, else the
    suite shipped in the package.  A directory means its layers.json.  Returns a path
    (or an importlib.resources Traversable for the shipped file)."""
    if path is None and os.environ.get("MEGAWINO_SUITE"):
        path = os.environ["MEGAWINO_SUITE"]
        origin = "MEGAWINO_SUITE"
    else:
        origin = "path argument"
    if path is None:
        return resources.files("megawino.data") / SHIPPED_SUITE
    candidate = Path(path).expanduser()
    if candidate.is_dir():
        candidate = candidate / "layers.json"
    if not candidate.is_file():
        raise FileNotFoundError(f"suite file {str(candidate)!r} (from {origin}) does not exist")
    return candidate


def load_suite(path: str | os.PathLike | None = None, suite: str = "winograd",
               batch: int | None = None, layout: str = "NCHW") -> list[LayerSpec]:
    """Layer specs of one suite of a layers.json (keys N, C, K, H, W, R, S, stride,
    pad, name).  ``batch`` overrides N when given."""
    file = suite_path(path)
    data = read_json(file, "JSON suite file")
    suites = {k: v for k, v in data.items() if isinstance(v, list)} if isinstance(data, dict) else {}
    if suite not in suites:
        raise ValueError(f"{file}: no suite {suite!r}; suites: {', '.join(suites) or 'none'}")
    specs = []
    for i, entry in enumerate(suites[suite]):
        try:
            H = entry["H"]
            R = entry.get("R", 3)
            specs.append(LayerSpec(
                N=entry["N"] if batch is None else batch,
                C=entry["C"], K=entry["K"], H=H, W=entry.get("W", H),
                R=R, S=entry.get("S", R), stride=entry.get("stride", 1),
                padding=entry.get("pad", entry.get("padding", R // 2)),
                layout=layout, name=entry.get("name", f"{suite}[{i}]")))
        except KeyError as err:
            raise ValueError(f"{file}: {suite}[{i}] lacks key {err}") from None
        except ValueError as err:
            raise ValueError(f"{file}: {suite}[{i}] ({entry.get('name', '?')}): {err}") from None
    return specs


def select_specs(specs: Sequence[LayerSpec], names: str | Sequence[str] | None) -> list[LayerSpec]:
    """Layers by exact name or unique substring, in the order named, each once (``names``
    a list or a comma-separated string; all layers when empty); ValueError for a name that
    matches no layer or several."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",")]
    names = [n for n in (names or []) if n]
    if not names:
        return list(specs)
    chosen = []
    for name in names:
        exact = [s for s in specs if s.name == name]
        hits = exact or [s for s in specs if name.lower() in s.name.lower()]
        if len(hits) != 1:
            raise ValueError(f"layer {name!r} matches {len(hits)} layers of the suite "
                             f"({', '.join(s.name for s in hits) or 'none'}); "
                             f"known: {', '.join(s.name for s in specs)}")
        if hits[0] not in chosen:
            chosen.append(hits[0])
    return chosen
