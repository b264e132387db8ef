"""Run settings: `darkpy.toml` defaults that command-line flags override.

The file is looked for in the current directory and then in each parent, so a command run from a
subfolder of a project still finds the project's settings. Every key is optional; a missing file
means the built-in defaults. Unknown sections or keys and wrongly typed values are errors that name
the file and the key (a typo like `sed = 1` must not be silently ignored).

```toml
[paths]
backup = "backup"     # checkpoints, the training log and chart.png (a .data `backup=` wins)
[run]
seed = 0              # weight init, shuffling and augmentation
threads = 0           # numba + BLAS threads; 0 = all cores
progress = "auto"     # "auto" (bar on a terminal, lines otherwise), "bar", "lines", "none"
strict = false        # every cfg/data warning is an error (`train --strict`)
[images]
max_pixels = 178956970  # larger images are refused (a decompression-bomb guard; Pillow's own limit)
```
"""
from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .errors import DarkpyError

FILE_NAME = "darkpy.toml"
PROGRESS_STYLES = ("auto", "bar", "lines", "none")

#: section -> key -> (type, Settings attribute)
_SCHEMA: dict[str, dict[str, tuple[type, str]]] = {
    "paths": {"backup": (str, "backup")},
    "run": {"seed": (int, "seed"), "threads": (int, "threads"), "progress": (str, "progress"),
            "strict": (bool, "strict")},
    "images": {"max_pixels": (int, "max_pixels")},
}
#: Pillow's own refusal threshold (2 x Image.MAX_IMAGE_PIXELS): the default image size limit
MAX_PIXELS = 178_956_970


class SettingsError(DarkpyError):
    """A problem in darkpy.toml."""


@dataclass(frozen=True)
class Settings:
    """Resolved run settings. Precedence for the backup folder: `--backup` flag, then the .data
    file's `backup=` key, then this value (which comes from darkpy.toml or the default)."""

    backup: str = "backup"
    seed: int = 0
    threads: int = 0
    progress: str = "auto"
    strict: bool = False             # cfg/data warnings are errors (see darkpy.errors.strict_warnings)
    max_pixels: int = MAX_PIXELS     # images with more pixels are refused (`[images] max_pixels`)
    file: str | None = None          # the darkpy.toml the values came from, if any

    def override(self, **flags) -> "Settings":
        """A copy with every flag that is not None applied (flags beat the file)."""
        changes = {k: v for k, v in flags.items() if v is not None}
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise TypeError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        s = dataclasses.replace(self, **changes)
        s.validate()
        return s

    def validate(self) -> None:
        where = self.file or "settings"
        if self.progress not in PROGRESS_STYLES:
            raise SettingsError(f"{where}: progress must be one of {', '.join(PROGRESS_STYLES)} "
                                f"(got {self.progress!r})")
        if self.threads < 0:
            raise SettingsError(f"{where}: threads must be >= 0, 0 meaning all cores (got {self.threads})")
        if self.seed < 0:
            raise SettingsError(f"{where}: seed must be >= 0 (got {self.seed})")
        if self.max_pixels < 1:
            raise SettingsError(f"{where}: images.max_pixels must be >= 1 (got {self.max_pixels})")
        if not self.backup:
            raise SettingsError(f"{where}: backup must name a folder")


def find_settings_file(start: str | os.PathLike | None = None) -> Path | None:
    """The nearest darkpy.toml in `start` (default: the current directory) or one of its parents."""
    here = Path(start or os.getcwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / FILE_NAME
        if candidate.is_file():
            return candidate
    return None


def load_settings(path: str | os.PathLike | None = None) -> Settings:
    """Read `path` (default: the nearest darkpy.toml); built-in defaults when there is none."""
    file = Path(path) if path is not None else find_settings_file()
    if file is None:
        return Settings()
    try:
        with open(file, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise SettingsError(f"{file}: no such settings file") from None
    except tomllib.TOMLDecodeError as e:
        raise SettingsError(f"{file}: invalid TOML ({e})") from None
    except OSError as e:
        raise SettingsError(f"{file}: cannot read ({e.strerror})") from None
    values: dict[str, object] = {}
    for section, table in data.items():
        keys = _SCHEMA.get(section)
        if keys is None or not isinstance(table, dict):
            raise SettingsError(f"{file}: unknown section [{section}] (expected "
                                f"{', '.join(f'[{s}]' for s in _SCHEMA)})")
        for key, value in table.items():
            if key not in keys:
                raise SettingsError(f"{file}: unknown key {section}.{key} (known: "
                                    f"{', '.join(f'{section}.{k}' for k in keys)})")
            typ, attr = keys[key]
            if not isinstance(value, typ) or (typ is not bool and isinstance(value, bool)):
                what = {int: "an integer", bool: "true or false"}.get(typ, "a string")
                raise SettingsError(f"{file}: {section}.{key} must be {what} (got {value!r})")
            values[attr] = value
    settings = Settings(**values, file=str(file))
    settings.validate()
    return settings
