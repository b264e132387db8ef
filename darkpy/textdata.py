"""Text training data: Darknet's char-RNN data path (`train_char_rnn`) and padded line tasks.

A text `.data` file names a byte corpus with `text=FILE` (and optionally `valid=FILE`, held-out text
of the same kind). Tokens are bytes (vocabulary 256). Rows are TIME-MAJOR, as `[rnn]`/`[gru]`/`[lstm]`
read them: within one forward pass of `steps = time_steps` steps and `S` sequences, row `t·S + s` is
step t of sequence s; the next subdivision's sequences follow.

Two modes (`.data` key `sequences=`):
- `stream` (default, Darknet's char-RNN): the full batch holds `streams = batch·subdivisions /
  time_steps` parallel streams; stream g starts at byte `g·L // streams` (evenly spaced; darknet:
  random offsets) and iteration k reads bytes `start + k·steps + t` (mod L), the target being the byte
  after each. The hidden state of recurrent layers is carried from one update to the next within a
  stream (`prepare_network`, `begin_pass`, `end_pass`) and zeroed when the stream passes the end of
  the text (darknet: zeroed at random, 1/64 per stream per iteration). With `subdivisions` > 1 each
  pass holds `streams / subdivisions` of the streams, so the state of every stream is kept here
  (`carried`, one array per state array of each recurrent layer, all streams, pass-major) and each
  pass loads its own streams' rows before its forward and stores them after. Everything is a pure
  function of k, so a resumed run reads the same bytes; the carried state itself is saved in the
  `.state` file (the same arrays and names as before for subdivisions=1).
- `lines`: each line of the text is one sequence (`line + "\\n"`, then `pad=` ids up to
  `time_steps + 1`), drawn by the epoch permutations of `BatchPlan`. Targets that are the pad id, and
  with `answer_after=C` every target before the first C of the line, are set to the loss layer's
  `ignore_index` (id targets) or an all-zero row (one-hot targets). `pack=K` (default 1) puts K lines
  back to back in each training sequence (then the pads), so a long context is not mostly padding;
  each line keeps its own ignore rule (the target of a line's last byte is the next line's first,
  a prompt byte, so it is ignored with `answer_after`). Scoring (`darkpy textscore`) reads one line
  per sequence.

Encoding follows the network: `inputs=256` gives one-hot rows (Darknet), `inputs=1` gives the token
id (for `[embedding]`); a last layer reading one truth per row gets ids, otherwise one-hot rows.
"""
from __future__ import annotations

import os

import numpy as np

from .batches import BatchPlan
from .errors import DataError

VOCAB = 256
MODES = ("stream", "lines")


def is_text_data(dc) -> bool:
    return "text" in dc.raw


def read_bytes(path: str, what: str = "text") -> np.ndarray:
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such {what} file")
    data = np.fromfile(path, np.uint8)
    if data.size < 2:
        raise DataError(f"{path}: the {what} file has {data.size} bytes; it needs at least 2")
    return data


def text_file(dc, key: str = "text") -> str:
    """The path of the .data file's `key`, relative to the current directory or the .data's folder."""
    value = dc.raw[key]
    if os.path.isabs(value) or os.path.isfile(value):
        return value
    beside = os.path.join(os.path.dirname(dc.path) or ".", value)
    if os.path.isfile(beside):
        return beside
    raise DataError(f"{dc.path} {key}: no such file {value!r} (looked in the current directory and beside "
                    f"the .data file)")


def _int_key(dc, key: str, default: int) -> int:
    value = dc.raw.get(key)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise DataError(f"{dc.path} {key}: expected an integer (got {value!r})") from None


class StreamPlan:
    """Byte positions of iteration k's rows (stream mode): a pure function of k."""

    def __init__(self, length: int, streams: int, steps: int, subdivisions: int):
        self.n, self.streams, self.steps, self.subdivisions = length, streams, steps, subdivisions
        self.starts = np.arange(streams, dtype=np.int64) * length // streams

    def indices(self, k: int) -> np.ndarray:
        spb = self.streams // self.subdivisions
        t = np.arange(self.steps, dtype=np.int64)
        out = []
        for j in range(self.subdivisions):
            g = self.starts[j * spb:(j + 1) * spb]
            out.append(((g[None, :] + k * self.steps + t[:, None]) % self.n).reshape(-1))   # (steps, spb)
        return np.concatenate(out)

    def wrapped(self, k: int) -> np.ndarray:
        """Streams whose window passed the end of the text since iteration k − 1 (all at k = 0)."""
        if k == 0:
            return np.arange(self.streams)
        now = (self.starts + k * self.steps) // self.n
        before = (self.starts + (k - 1) * self.steps) // self.n
        return np.nonzero(now != before)[0]


class TextData:
    """The dataset object the training loop reads: `plan(B, seed)`, `load(indices, rng, w, h)`."""

    def __init__(self, text: np.ndarray, net, mode: str = "stream", pad: int = 0,
                 answer_after: int | None = None, source: str = "<text>", pack: int = 1):
        cfg = net.config
        self.pack = pack
        self.text = text
        self.mode = mode
        self.pad = pad
        self.answer_after = answer_after
        self.steps = cfg.time_steps
        self.subdivisions = cfg.subdivisions
        self.rows = net.batch                     # rows per forward pass
        self.seq_per_pass = self.rows // self.steps
        self.onehot_in = net.input_shape == (VOCAB,)
        if not self.onehot_in and net.input_shape != (1,):
            raise DataError(f"{source}: a text network needs inputs={VOCAB} (one-hot bytes) or inputs=1 "
                            f"(token ids, for [embedding]); {net.file} has {net.input_shape}")
        self.truths = net.truths
        if self.truths not in (1, VOCAB):
            raise DataError(f"{source}: the last layer of {net.file} reads {self.truths} truth values per "
                            f"row; text targets are 1 (a token id) or {VOCAB} (one-hot)")
        self.ignore = getattr(net.layers[-1], "ignore_index", -1)
        if mode == "lines":
            self.lines = _split_lines(text, self.steps, source)
            self.samples = len(self.lines)
            longest = max(len(line) for line in self.lines)
            if pack > 1 and pack * longest > self.steps + 1:
                raise DataError(f"{source}: pack={pack} lines of up to {longest} bytes do not fit in "
                                f"time_steps={self.steps} (need pack x {longest} <= {self.steps + 1})")
        else:
            self.samples = int(text.size)
            self.stream_plan = StreamPlan(text.size, self.seq_per_pass * self.subdivisions, self.steps,
                                          self.subdivisions)
        self.carried_state(net)

    def __len__(self) -> int:
        return self.samples

    @property
    def rows_per_sample(self) -> float:
        """Batch rows one sample fills (for the log's epoch column): a byte is one row in stream
        mode; a line is `time_steps / pack` rows in lines mode."""
        return self.steps / self.pack if self.mode == "lines" else 1.0

    def plan(self, batch: int, seed: int):
        if self.mode == "lines":
            return BatchPlan(len(self.lines), batch // self.steps * self.pack, seed)
        return self.stream_plan

    # -- batches -----------------------------------------------------------------------------------
    def load(self, indices, rng, w, h) -> tuple[np.ndarray, np.ndarray]:
        """x, y for the rows named by `indices` (byte positions in stream mode, line numbers in lines
        mode); `rng`, `w`, `h` are unused (no augmentation, no image size)."""
        if self.mode == "lines":
            x_ids, y_ids = self._line_rows(np.asarray(indices))
        else:
            pos = np.asarray(indices, np.int64)
            x_ids = self.text[pos].astype(np.int64)
            y_ids = self.text[(pos + 1) % self.text.size].astype(np.int64)
        return self.encode_inputs(x_ids), self.encode_targets(y_ids)

    def _line_rows(self, lines: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        S, T, K = self.seq_per_pass, self.steps, self.pack
        x = np.empty(lines.size // K * T, np.int64)
        y = np.empty_like(x)
        for j in range(lines.size // (S * K)):
            xs, ys = self.sequences(lines[j * S * K:(j + 1) * S * K], K)
            x[j * S * T:(j + 1) * S * T] = xs.T.reshape(-1)       # time-major
            y[j * S * T:(j + 1) * S * T] = ys.T.reshape(-1)
        return x, y

    def sequences(self, lines, pack: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """(n / pack, steps) input and target ids of lines, `pack` consecutive lines per sequence,
        targets to ignore set to -1."""
        T = self.steps
        n = len(lines) // pack
        x = np.full((n, T), self.pad, np.int64)
        y = np.full((n, T), -1, np.int64)
        for i in range(n):
            parts = [self.lines[int(k)] for k in lines[i * pack:(i + 1) * pack]]
            seq = np.concatenate(parts)
            keep = np.ones(seq.size, bool)            # which bytes may be a target
            if self.answer_after is not None:
                start = 0
                for part in parts:
                    where = np.nonzero(part == self.answer_after)[0]
                    cut = int(where[0]) if where.size else part.size - 1
                    keep[start:start + cut + 1] = False     # the prompt and the separator itself
                    start += part.size
            m = min(seq.size - 1, T)
            x[i, :m] = seq[:m]
            y[i, :m] = np.where(keep[1:m + 1], seq[1:m + 1], -1)
        y[y == self.pad] = -1
        return x, y

    def encode_inputs(self, ids: np.ndarray) -> np.ndarray:
        if not self.onehot_in:
            return ids.astype(np.float32).reshape(-1, 1)
        x = np.zeros((ids.size, VOCAB), np.float32)
        x[np.arange(ids.size), ids] = 1
        return x

    def encode_targets(self, ids: np.ndarray) -> np.ndarray:
        if self.truths == 1:
            out = ids.astype(np.float32).reshape(-1, 1)
            out[ids < 0] = self.ignore
            return out
        y = np.zeros((ids.size, VOCAB), np.float32)
        keep = ids >= 0
        y[np.nonzero(keep)[0], ids[keep]] = 1
        return y

    # -- state carried between updates (stream mode) -------------------------------------------------
    def _recurrent(self, net) -> list:
        return [layer for layer in net.layers if hasattr(layer, "carry_state")] if self.mode == "stream" else []

    def carried_state(self, net) -> None:
        """Give each recurrent layer `carried`: its state for all streams (pass j's streams are rows
        j·S .. (j+1)·S − 1), kept from a resumed `.state` file when it has that shape, else zero."""
        streams = self.seq_per_pass * self.subdivisions
        for layer in self._recurrent(net):
            saved = getattr(layer, "carried", None) or []
            fresh = [np.zeros((streams, *a.shape[1:]), a.dtype) for a in layer._initial_state()]
            if len(saved) == len(fresh) and all(a.shape == b.shape for a, b in zip(saved, fresh)):
                fresh = [np.array(a, dtype=b.dtype) for a, b in zip(saved, fresh)]
            layer.carried = fresh

    def prepare_network(self, net, k: int) -> None:
        """Before iteration k: recurrent layers carry their state from the previous update, zeroed
        for the streams that wrapped (and for all at k = 0)."""
        wrapped = self.stream_plan.wrapped(k) if self.mode == "stream" else None
        for layer in self._recurrent(net):
            layer.carry_state = True
            for arr in layer.carried:
                arr[wrapped] = 0

    def _pass_rows(self, j: int) -> slice:
        return slice(j * self.seq_per_pass, (j + 1) * self.seq_per_pass)

    def begin_pass(self, net, j: int) -> None:
        """Before pass j's forward: each recurrent layer starts from its streams' carried state."""
        for layer in self._recurrent(net):
            for arr, full in zip(layer._initial_state(), layer.carried):
                arr[...] = full[self._pass_rows(j)]

    def end_pass(self, net, j: int) -> None:
        """After pass j: keep the state its forward ended with for those streams' next update."""
        for layer in self._recurrent(net):
            for arr, full in zip(layer._initial_state(), layer.carried):
                full[self._pass_rows(j)] = arr


def _split_lines(text: np.ndarray, steps: int, source: str) -> list[np.ndarray]:
    nl = ord("\n")
    ends = np.nonzero(text == nl)[0]
    out, start = [], 0
    for e in list(ends) + [text.size]:
        if e > start:
            out.append(np.append(text[start:e], nl).astype(np.int64))
        start = e + 1
    if not out:
        raise DataError(f"{source}: no lines")
    return out


def make_text_dataset(net, dc) -> TextData:
    """The TextData of a .data file with `text=` (see the module docstring for its keys)."""
    path = text_file(dc)
    mode = dc.raw.get("sequences", "stream")
    if mode not in MODES:
        raise DataError(f"{dc.path} sequences: expected one of {', '.join(MODES)} (got {mode!r})")
    pad = _int_key(dc, "pad", 0)
    pack = _int_key(dc, "pack", 1)
    if pack < 1 or (pack > 1 and mode != "lines"):
        raise DataError(f"{dc.path} pack: expected an integer >= 1, with sequences=lines (got {pack})")
    after = dc.raw.get("answer_after")
    if after is not None and len(after) != 1:
        raise DataError(f"{dc.path} answer_after: expected one character (got {after!r})")
    return TextData(read_bytes(path), net, mode, pad, ord(after) if after else None, source=path, pack=pack)
