"""`darkpy cfg check`: every problem in a cfg (errors and warnings) as one-line messages, in file
order, found by building its layers with shapes only (no buffer, no weight)."""
from __future__ import annotations

import warnings

from .cfg import CfgDocument, CfgWarning, load_cfg
from .errors import CfgError
from .memory import shapes_only


def check_cfg(path) -> list[str]:
    """Every problem in a cfg, as one-line messages (warnings included), in file order. Empty = clean."""
    return [message for message, _is_error in check_cfg_problems(path)]


def check_cfg_problems(path) -> list[tuple[str, bool]]:
    """As `check_cfg`, each message with whether it is an error (False: a warning)."""
    try:
        with warnings.catch_warnings():         # the reader's warnings come back in parse_warnings
            warnings.simplefilter("ignore", CfgWarning)
            doc = load_cfg(path)
    except CfgError as e:
        return [(str(e), True)]
    return cfg_problems(doc)


def cfg_problems(doc: CfgDocument) -> list[tuple[str, bool]]:
    """Every problem of a parsed document as (message, is_error), in the order they were found."""
    from .network import build_layers      # (network.py imports the layer registry; this stays light)
    found: list = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CfgWarning)
        try:
            with shapes_only():               # shapes and sizes only: no weight is allocated
                build_layers(doc, on_error=caught.append)
        except CfgError as e:
            caught.append(e)
        found = list(caught)
    out = [(message, False) for message in getattr(doc, "parse_warnings", ())]
    for item in found:
        if isinstance(item, CfgError):
            out.append((str(item), True))
        elif issubclass(item.category, CfgWarning):
            out.append((str(item.message), False))
    return out
