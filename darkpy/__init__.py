"""darkpy: Darknet's config-driven neural networks, in Python (numpy + numba)."""
from __future__ import annotations

from .errors import CfgError, DarkpyError, DataError, StateError, TrainingError, WeightsError
from .network import Network, load_network

__version__ = "0.1.0"
__all__ = ["load_network", "Network", "DarkpyError", "CfgError", "WeightsError", "DataError",
           "StateError", "TrainingError", "__version__"]
