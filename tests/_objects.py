"""Walk a Python object graph for the arrays it holds (privacy tests: is a training row in a
fitted model or anything reachable from it?)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


def reachable_arrays(obj, seen: set[int] | None = None) -> Iterator[np.ndarray]:
    """Every non-object ndarray reachable from ``obj`` through ``__dict__``, lists, tuples, sets
    and dicts (keys and values), each once; object arrays are searched item by item."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        if obj.dtype == object:
            for item in obj.ravel():
                yield from reachable_arrays(item, seen)
        else:
            yield obj
        return
    if isinstance(obj, dict):
        items = list(obj.keys()) + list(obj.values())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        items = list(obj)
    elif hasattr(obj, "__dict__"):
        items = list(vars(obj).values())
    else:
        return
    for item in items:
        yield from reachable_arrays(item, seen)
