"""Reading the JSON files megawino takes from users (mapping tables, direct tables, suites): only
what the runtime can use gets through, and every refusal is one line naming the file.

Python's ``json`` module accepts ``NaN`` and ``Infinity``, turns ``1e999`` into inf, parses integers
of any length and recurses once per nesting level (a deep enough array is a RecursionError);
:func:`read_json` refuses each of these as a ValueError instead.
"""
from __future__ import annotations

import json
import math
import pathlib

MAX_INTEGER_DIGITS = 19          # every integer megawino reads fits int64


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a number megawino can use")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} overflows a float")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INTEGER_DIGITS:
        raise ValueError(f"the integer {text[:12]}... has {len(text.lstrip('-'))} digits, more than "
                         f"{MAX_INTEGER_DIGITS}")
    return int(text)


def loads(text: str, source, what: str):
    """``text`` parsed as JSON, or a one-line ValueError ``"<source>: not a <what> (why)"``."""
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float,
                          parse_int=_bounded_int)
    except RecursionError:
        raise ValueError(f"{source}: not a {what} (nested too deeply)") from None
    except ValueError as err:            # json.JSONDecodeError and the refusals above
        raise ValueError(f"{source}: not a {what} ({' '.join(str(err).split())})") from None


def read_json(path, what: str):
    """The JSON file at ``path`` (see :func:`loads`); a file that is not UTF-8 text is a ValueError."""
    path = pathlib.Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a {what} (not UTF-8 text)") from None
    return loads(text, path, what)
