"""darkpy: Darknet's config-driven neural networks, in Python (numpy + numba).

`import darkpy` is light and changes nothing outside darkpy: `Network` and `load_network` load
their modules (numpy, numba) on first use, so the `darkpy` command can set its own process's
runtime settings first (see `darkpy.process`).
"""
from __future__ import annotations

from .errors import CfgError, DarkpyError, DataError, StateError, TrainingError, WeightsError

__version__ = "0.1.0"
__all__ = ["load_network", "Network", "DarkpyError", "CfgError", "WeightsError", "DataError",
           "StateError", "TrainingError", "__version__", "export_onnx"]

#: Public names loaded on first access: name -> module that defines it (so `import darkpy` loads
#: neither numpy nor onnx).
_LAZY = {"Network": ".network", "load_network": ".network", "export_onnx": ".export"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
