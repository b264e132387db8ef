"""darkpy: Darknet's config-driven neural networks, in Python (numpy + numba)."""
from __future__ import annotations

import os as _os

# OpenBLAS's worker threads spin for 2^28 cycles after each GEMM by default, holding the cores that
# numba's parallel kernels need right after it (measured on 2 cores: batch-1 inference 20 % and a
# cifar training step 27 % faster with "4", i.e. sleep at once). OpenBLAS reads it when numpy loads
# it: it only takes effect when darkpy is imported before numpy (as the `darkpy` command does).
_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

from .errors import CfgError, DarkpyError, DataError, StateError, TrainingError, WeightsError
from .network import Network, load_network

__version__ = "0.1.0"
__all__ = ["load_network", "Network", "DarkpyError", "CfgError", "WeightsError", "DataError",
           "StateError", "TrainingError", "__version__", "export_onnx"]


def __getattr__(name):
    """`darkpy.export_onnx` is imported on first use, so `import darkpy` never imports onnx."""
    if name == "export_onnx":
        from .export import export_onnx
        return export_onnx
    raise AttributeError(f"module 'darkpy' has no attribute {name!r}")
