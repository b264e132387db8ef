"""Generate the algorithmic task of cfg/tiny-gpt-sort.cfg: sort a string of digits.

Each line is `DIGITS=SORTED`, e.g. `40391=01349`, with 3 to 8 digits drawn uniformly. Lines are
padded to the network's context by the data loader (`pad=` in data/tiny-gpt-sort.data); the loss
ignores pad targets and everything before the `=` (`answer_after==`), so the model is scored only on
the answer. train.txt and valid.txt are disjoint (a held-out line never appears in training).

    python data/algo/make_sort.py              # writes data/algo/train.txt (20000) and valid.txt (1000)
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def make_lines(n: int, rng: np.random.Generator, lo: int = 3, hi: int = 8) -> list[str]:
    out = []
    for _ in range(n):
        digits = "".join(map(str, rng.integers(0, 10, int(rng.integers(lo, hi + 1)))))
        out.append(f"{digits}={''.join(sorted(digits))}")
    return out


def build(out: Path, n_train: int = 20000, n_valid: int = 1000, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    valid = list(dict.fromkeys(make_lines(2 * n_valid, rng)))[:n_valid]
    held = set(valid)
    train: list[str] = []
    while len(train) < n_train:
        train += [line for line in make_lines(n_train, rng) if line not in held]
    (out / "train.txt").write_text("\n".join(train[:n_train]) + "\n")
    (out / "valid.txt").write_text("\n".join(valid) + "\n")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    ap.add_argument("--train", type=int, default=20000)
    ap.add_argument("--valid", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    build(a.out, a.train, a.valid, a.seed)
    print(f"wrote {a.out}/train.txt ({a.train} lines) and {a.out}/valid.txt ({a.valid} lines)")
