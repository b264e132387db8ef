"""Build the text corpus of cfg/char-rnn.cfg and cfg/tiny-gpt.cfg from this project's own files.

No external text: the corpus is the repository's README, its docs (Markdown) and its Python source
(darkpy/, tests/, benchmarks/, data/), each file once, in sorted path order, separated by a header
line naming the file. Bytes outside 1..255 are dropped (Darknet's char-RNN rejects byte 0). The
files are split by name into train (about 90 % of the bytes) and valid (every 10th file), so the
held-out text is whole files the model never saw.

    python data/text/make_corpus.py            # writes data/text/train.txt and data/text/valid.txt
"""
from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PATTERNS = ("README.md", "docs/**/*.md", "darkpy/**/*.py", "tests/**/*.py", "benchmarks/**/*.py",
            "data/**/*.py")


def corpus_files(root: Path = ROOT) -> list[Path]:
    found: set[Path] = set()
    for pattern in PATTERNS:
        found.update(p for p in root.glob(pattern) if p.is_file())
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def build(root: Path = ROOT, out: Path | None = None, every: int = 10) -> tuple[int, int]:
    out = out or Path(__file__).resolve().parent
    parts: dict[str, list[bytes]] = {"train": [], "valid": []}
    for i, p in enumerate(corpus_files(root)):
        body = bytes(b for b in p.read_bytes() if b != 0)
        head = f"# ==== {p.relative_to(root).as_posix()} ====\n".encode()
        parts["valid" if i % every == every - 1 else "train"].append(head + body + b"\n")
    sizes = []
    for name in ("train", "valid"):
        data = b"".join(parts[name])
        (out / f"{name}.txt").write_bytes(data)
        sizes.append(len(data))
    return sizes[0], sizes[1]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="folder for train.txt and valid.txt")
    args = ap.parse_args()
    n_train, n_valid = build(out=args.out)
    print(f"train.txt: {n_train} bytes, valid.txt: {n_valid} bytes")
