"""Training progress: a Darknet-style line per iteration, a bar with ETA on a terminal, a CSV log.

The line is Darknet's classifier line, so tools that parse Darknet logs keep working:

    300, 20.870: 0.131447, 0.152301 avg, 0.050000 rate, 0.031284 seconds, 19200 images

= iteration, epochs, loss, average loss, learning rate, seconds for the iteration, images seen; in
"lines" style it ends with the time left (`, 01:23 left`, as AlexeyAB's "hours left"), which the bar
shows otherwise. `parse_line` reads one back (the time left as `eta` seconds). The library never prints by itself: the trainer reports through a
`Progress` handed to it (the CLI builds one from the `progress` setting).
"""
from __future__ import annotations

import csv
import math
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import IO

LOG_FIELDS = ("iteration", "epoch", "loss", "avg_loss", "cost_mean", "rate", "seconds", "images", "map",
              "grad_norm")

_LINE = re.compile(
    r"^\s*(?P<iteration>\d+), (?P<epoch>[-\d.]+): (?P<loss>\S+), (?P<avg_loss>\S+) avg, "
    r"(?P<rate>\S+) rate, (?P<seconds>\S+) seconds, (?P<images>\d+) images"
    r"(?:, (?P<eta>[-\d:]+) left)?\s*$")


@dataclass
class Record:
    """One training iteration, as logged."""

    iteration: int          # updates done so far (1 after the first update)
    epoch: float            # images seen / training-set size
    loss: float             # per-image loss of this iteration (Darknet's train_network value)
    avg_loss: float         # Darknet's running average: 0.9·avg + 0.1·loss
    cost_mean: float        # mean per output element (compares across batch and input sizes)
    rate: float             # learning rate used for this update
    seconds: float          # wall time of the iteration
    images: int             # images seen so far (the weights header's `seen`)
    map: float = math.nan   # detector mAP@0.5 on the valid list when measured at this iteration (`--map`)
    grad_norm: float = math.nan   # with [net] clip_norm: the global gradient norm before clipping

    def line(self) -> str:
        return (f"{self.iteration}, {self.epoch:.3f}: {self.loss:f}, {self.avg_loss:f} avg, "
                f"{self.rate:f} rate, {self.seconds:f} seconds, {self.images} images")


def parse_line(line: str) -> dict[str, float] | None:
    """The numbers of one progress line (None if `line` is not one)."""
    m = _LINE.match(line)
    if m is None:
        return None
    out: dict[str, float] = {}
    for key, text in m.groupdict().items():
        if key == "eta":
            if text is not None:
                out[key] = _parse_seconds(text)
            continue
        out[key] = int(text) if key in ("iteration", "images") else float(text)
    return out


def _parse_seconds(text: str) -> float:
    """format_seconds read back: "1:02:03", "02:03" -> seconds; "--:--" -> nan."""
    if "-" in text:
        return math.nan
    value = 0
    for part in text.split(":"):
        value = value * 60 + int(part)
    return float(value)


class Progress:
    """Prints progress. `style`: "lines" (one line per iteration), "bar" (the lines plus a bar with
    ETA redrawn under them), "none" (no iteration output), or "auto" (bar when `stream` is a
    terminal, else lines). Messages (resuming, first-run compile) print in every style unless
    `quiet` (the library's default reporter is quiet: it prints nothing)."""

    def __init__(self, style: str = "auto", stream: IO[str] | None = None, quiet: bool = False):
        self.stream = stream if stream is not None else sys.stdout
        self.quiet = quiet
        if style == "auto":
            isatty = getattr(self.stream, "isatty", None)
            style = "bar" if isatty is not None and isatty() else "lines"
        self.style = style
        self.total = 0
        self.first = 0
        self._t1: float | None = None        # when the run's first reported iteration ended
        self._i1 = 0                          # ... and which one it was
        self._bar_shown = False

    def begin(self, first: int, total: int) -> None:
        """Training runs iterations first+1 .. total."""
        self.first, self.total = first, total
        self._t1 = None

    def message(self, text: str) -> None:
        """An informational line (resuming, first-run compile, where checkpoints go)."""
        if self.quiet:
            return
        self._clear_bar()
        print(text, file=self.stream, flush=True)

    def iteration(self, rec: Record) -> None:
        if self.style == "none":
            return
        self._clear_bar()
        line = rec.line() if self.style == "bar" else f"{rec.line()}, {format_seconds(self.eta(rec))} left"
        if self._t1 is None:
            self._t1, self._i1 = time.perf_counter(), rec.iteration
        print(line, file=self.stream, flush=self.style != "bar")
        if self.style == "bar":
            self.stream.write(self.bar(rec))
            self.stream.flush()
            self._bar_shown = True

    def eta(self, rec: Record) -> float:
        """Seconds left after `rec`, at the run's mean pace since its first reported iteration
        ended; nan until a second one is reported. The first one is left out because it may hold
        the first run's kernel compile (digits: 82 s against 9 ms per iteration after it, which made
        its first ETA read 13 hours)."""
        if self._t1 is None or rec.iteration <= self._i1:
            return math.nan
        pace = (time.perf_counter() - self._t1) / (rec.iteration - self._i1)
        return pace * (self.total - rec.iteration)

    def bar(self, rec: Record, width: int = 30) -> str:
        done = rec.iteration - self.first
        todo = max(self.total - self.first, 1)
        frac = min(max(done / todo, 0.0), 1.0)
        fill = int(round(frac * width))
        eta = self.eta(rec)
        return (f"\r{frac * 100:5.1f}% |{'#' * fill}{'.' * (width - fill)}| {rec.iteration}/{self.total} "
                f"avg {rec.avg_loss:.4f}  ETA {format_seconds(eta)} ")

    def _clear_bar(self) -> None:
        if self._bar_shown:
            self.stream.write("\r\033[K")
            self._bar_shown = False

    def close(self) -> None:
        self._clear_bar()
        self.stream.flush()


def format_seconds(s: float) -> str:
    if not math.isfinite(s):
        return "--:--"
    s = int(round(s))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m:02d}:{sec:02d}"


class CsvLog:
    """The training log, one row per iteration (`LOG_FIELDS`), flushed as it goes.

    On resume at iteration k, rows after k (written by the run that was interrupted after its last
    checkpoint) are dropped, so the log and the chart continue the curve from the checkpoint."""

    def __init__(self, path: str | os.PathLike, resume_from: int | None):
        self.path = os.fspath(path)
        kept = [r for r in read_log(self.path) if r.iteration <= resume_from] if resume_from else []
        tmp = f"{self.path}.tmp{os.getpid()}"
        with open(tmp, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(LOG_FIELDS)
            for r in kept:
                w.writerow(_row(r))
        os.replace(tmp, self.path)
        self.records: list[Record] = kept
        self._f = open(self.path, "a", newline="")
        self._w = csv.writer(self._f)

    def write(self, rec: Record) -> None:
        self.records.append(rec)
        self._w.writerow(_row(rec))
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def _row(r: Record) -> list:
    return [r.iteration, f"{r.epoch:.4f}", repr(r.loss), repr(r.avg_loss), repr(r.cost_mean),
            repr(r.rate), f"{r.seconds:.6f}", r.images, "" if math.isnan(r.map) else repr(r.map),
            "" if math.isnan(r.grad_norm) else repr(r.grad_norm)]


def read_log(path: str | os.PathLike) -> list[Record]:
    """The records of a training log (empty when the file does not exist)."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except FileNotFoundError:
        return []
    out = []
    for row in rows:
        try:
            out.append(Record(**{name: (int(row[name]) if name in ("iteration", "images") else float(row[name]))
                                 for name in LOG_FIELDS if name not in ("map", "grad_norm")},
                              map=float(row.get("map") or "nan"),   # older logs have no map column
                              grad_norm=float(row.get("grad_norm") or "nan")))
        except (KeyError, TypeError, ValueError):
            continue   # a line cut short by a kill: ignore it
    return out
