"""darkpy's error types.

Every error a user can cause is a `DarkpyError`: the CLI prints its message on one line and exits
non-zero, without a traceback. The message always names the place (file, line, section, key) and,
where one exists, the fix.
"""
from __future__ import annotations


class DarkpyError(Exception):
    """Base class of every error darkpy reports to a user."""


class CfgError(DarkpyError):
    """A problem in a .cfg/.yaml network file, located as `file:line [section #i type] key: message`.

    `index` is the layer index (-1 for `[net]`, None when the problem is not in one section).
    """

    def __init__(self, message: str, file: str | None = None, line: int | None = None,
                 index: int | None = None, kind: str | None = None, key: str | None = None):
        self.message = message
        self.file, self.line, self.index, self.kind, self.key = file, line, index, kind, key
        super().__init__(self.format())

    def format(self) -> str:
        where = ""
        if self.file is not None:
            where = f"{self.file}:{self.line}" if self.line else str(self.file)
        if self.kind is not None:
            sec = "net" if self.index is None or self.index < 0 else f"section #{self.index}"
            where += f" [{sec} {self.kind}]" if sec != "net" else f" [{self.kind}]"
        if self.key:
            where += f" {self.key}"
        return f"{where.strip()}: {self.message}" if where.strip() else self.message


class WeightsError(DarkpyError):
    """A .weights file that does not fit the network (size, header) or cannot be read. `mismatch` is
    True when the file is a weights file of another size (another cfg, input size or class count)."""

    def __init__(self, message: str, mismatch: bool = False):
        super().__init__(message)
        self.mismatch = mismatch

    def with_cfg_hint(self) -> "WeightsError":
        """This error, with the likely cause appended when the file is of another network's size."""
        if not self.mismatch:
            return self
        return WeightsError(f"{self} (was it trained with another cfg, input size or number of classes?)",
                            mismatch=True)


class DataError(DarkpyError):
    """A problem with a .data file, list file, label file or image."""


class StateError(DarkpyError):
    """The network was used out of order (e.g. backward without a training forward with truth)."""


class TrainingError(DarkpyError):
    """Training cannot go on (e.g. a NaN or infinite loss)."""


class StrictError(DarkpyError):
    """A warning turned into an error by `--strict` (see `strict_warnings`)."""


class strict_warnings:
    """`with strict_warnings(enabled):` — within the block, darkpy's own warnings (cfg and data
    problems: CfgWarning, DataWarning) raise `StrictError` instead of being shown. The warnings
    filter is changed only inside the block and restored on exit; importing darkpy changes none."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self._catch = None

    def __enter__(self):
        if not self.enabled:
            return self
        import warnings

        from .cfg import CfgWarning
        from .dataformats import DataWarning
        self._kinds = (CfgWarning, DataWarning)
        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        for kind in self._kinds:
            warnings.simplefilter("error", kind)
        return self

    def __exit__(self, exc_type, exc, tb):
        if self._catch is None:
            return False
        self._catch.__exit__(exc_type, exc, tb)
        self._catch = None
        if exc is not None and isinstance(exc, self._kinds):
            raise StrictError(f"{exc} (an error under --strict)") from exc
        return False
