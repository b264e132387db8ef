"""All-or-nothing changes to a network: a shallow snapshot of its objects' attributes, put back
when a change fails halfway (`Network.resize` refuses a size that does not fit and leaves the
network exactly as it was)."""
from __future__ import annotations


def snapshot(objs) -> list[tuple[object, dict]]:
    """A shallow copy of the attributes of `objs` and of every darkpy object they hold (layers, their
    inner layers and helpers), so that `restore` puts back exactly what was there (arrays included,
    by reference: resize and allocate replace arrays, they do not write into them)."""
    out: list[tuple[object, dict]] = []
    seen: set[int] = set()
    stack = list(objs)
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        attrs = dict(vars(obj))
        out.append((obj, attrs))
        for v in attrs.values():
            for item in (v if isinstance(v, (list, tuple)) else (v,)):
                if hasattr(item, "__dict__") and type(item).__module__.startswith("darkpy.layers"):
                    stack.append(item)
    return out


def restore(saved: list[tuple[object, dict]]) -> None:
    for obj, attrs in saved:
        vars(obj).clear()
        vars(obj).update(attrs)
