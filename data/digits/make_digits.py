"""Regenerate darkpy's bundled digits dataset from scikit-learn's copy of the UCI digits.

Run from the repository root:  pip install scikit-learn && python data/digits/make_digits.py
(scikit-learn is needed only here, not by darkpy.) The output is deterministic: the same files, byte
for byte, on every run with the same scikit-learn data.

Writes:
  data/digits/train/NNNN_<name>.png, data/digits/test/NNNN_<name>.png
      8x8 8-bit greyscale PNGs; NNNN is the sample's index in sklearn.datasets.load_digits(), <name>
      its class (zero .. nine); pixel = round(value * 255 / 16) (the data are 0..16 ink counts, so the
      digit is bright on a dark background).
  data/digits/train.list, data/digits/test.list
      one path per line, relative to the repository root.
  data/digits.names
      the class names zero .. nine, one per line (also the classifier labels: each file name contains
      exactly one of them, and none occurs elsewhere in the paths).
  data/digits.data
      the Darknet .data file.
Split: stratified, 20% test, random_state=0 (1437 train, 360 test).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from PIL import Image
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
ROOT = Path(__file__).resolve().parents[2]   # the repository root
DATA = "data/digits"

DATA_FILE = """\
# darkpy's bundled dataset: 1797 handwritten digits, 8x8 greyscale (see data/digits/README.md)
classes=10
train=data/digits/train.list
valid=data/digits/test.list
names=data/digits.names
labels=data/digits.names
backup=backup/
top=2
"""


def main() -> None:
    digits = load_digits()
    images, target = digits.images, digits.target
    idx = np.arange(len(target))
    train_idx, test_idx = train_test_split(idx, test_size=0.2, stratify=target, random_state=0)
    os.chdir(ROOT)
    for split, chosen in (("train", np.sort(train_idx)), ("test", np.sort(test_idx))):
        folder = Path(DATA, split)
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("*.png"):
            old.unlink()
        lines = []
        for i in chosen:
            pixels = np.rint(images[i] * 255 / 16).astype(np.uint8)
            path = folder / f"{i:04d}_{NAMES[target[i]]}.png"
            Image.fromarray(pixels).save(path, optimize=True)
            lines.append(path.as_posix())
        Path(DATA, f"{split}.list").write_text("\n".join(lines) + "\n")
        print(f"{split}: {len(lines)} images")
    Path("data/digits.names").write_text("\n".join(NAMES) + "\n")
    Path("data/digits.data").write_text(DATA_FILE)


if __name__ == "__main__":
    main()
