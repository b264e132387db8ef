"""Mutation fuzzing of the shared cfgs (issue 15): every mutant of a real cfg, run through
`darkpy cfg check`, `darkpy summary` and a real build, ends in success or a one-line darkpy error —
never a traceback — within bounded memory and time.

Mutations: a value set to 0, -1, 1e9, 3.5, text or nothing; a section deleted, duplicated or swapped
with another; the file truncated; a NUL or a non-ASCII character (a full-width digit, an accented
letter, a right-to-left mark) inserted. Seeded, so a failure reproduces.

Bounds: the mutants run in worker subprocesses (tests/cfg_mutation_worker.py) whose address space is
capped (RLIMIT_AS) at what they use after importing darkpy plus BOUND (1 GiB), each step under an
alarm of STEP_LIMIT seconds. The default pass is MUTANTS mutants (about 30 s on 2 cores);
DARKPY_CFG_FUZZ=N runs N mutants (e.g. 2000 for a long pass), DARKPY_CFG_FUZZ_SEED picks the seed.
"""
from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import shared_path

ROOT = Path(__file__).resolve().parents[1]
MUTANTS = int(os.environ.get("DARKPY_CFG_FUZZ", "120"))
SEED = int(os.environ.get("DARKPY_CFG_FUZZ_SEED", "15"))
BOUND = 1 << 30
STEP_LIMIT = 20.0
VALUES = ("0", "-1", "1e9", "3.5", "abc", "", "100000", "1e7")
INSERTS = ("\0", "３", "é", "\u202e", "\ufeff")


def _sections(text: str) -> list[tuple[int, int]]:
    """(start, end) character spans of each `[section]` block."""
    starts = [m.start() for m in re.finditer(r"^\[", text, re.M)] + [len(text)]
    return list(zip(starts, starts[1:]))


def mutate(text: str, rng: random.Random) -> tuple[str, str]:
    """One random mutation of a cfg's text, and what it was."""
    kind = rng.choice(["value", "value", "value", "delete", "duplicate", "swap", "truncate", "insert"])
    secs = _sections(text)
    if kind == "value":
        lines = [m for m in re.finditer(r"^([A-Za-z_0-9]+)\s*=\s*(.*)$", text, re.M)]
        if lines:
            m = rng.choice(lines)
            v = rng.choice(VALUES)
            return text[:m.start(2)] + v + text[m.end(2):], f"{m[1]}={v!r}"
    if kind in ("delete", "duplicate", "swap") and len(secs) > 2:
        i, j = sorted(rng.sample(range(1, len(secs)), 2))       # never [net]
        (a, b), (c, d) = secs[i], secs[j]
        if kind == "delete":
            return text[:a] + text[b:], f"delete section {i}"
        if kind == "duplicate":
            return text[:b] + text[a:b] + text[b:], f"duplicate section {i}"
        return text[:a] + text[c:d] + text[b:c] + text[a:b] + text[d:], f"swap sections {i} and {j}"
    if kind == "truncate":
        n = rng.randrange(len(text) + 1)
        return text[:n], f"truncate at {n}"
    ch = rng.choice(INSERTS)
    n = rng.randrange(len(text) + 1)
    return text[:n] + ch + text[n:], f"insert {ch!r} at {n}"


def _cfgs() -> list[Path]:
    return sorted(shared_path("cfg").rglob("*.cfg"))


@pytest.mark.slow
def test_mutated_shared_cfgs_end_in_success_or_a_darkpy_error(tmp_path):
    cfgs = _cfgs()
    assert len(cfgs) >= 30
    rng = random.Random(SEED)
    files, what = [], {}
    for k in range(MUTANTS):
        src = cfgs[k % len(cfgs)] if k < len(cfgs) else rng.choice(cfgs)
        text, how = mutate(src.read_text(encoding="utf-8", errors="replace"), rng)
        p = tmp_path / f"m{k:05d}_{src.stem}.cfg"
        p.write_bytes(text.encode("utf-8", "surrogatepass"))
        files.append(str(p))
        what[str(p)] = f"{src.relative_to(src.parents[1])}: {how}"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    results, peaks = [], []
    workers = 2
    chunks = [files[i::workers] for i in range(workers)]
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "cfg_mutation_worker.py"), str(BOUND),
                               str(STEP_LIMIT), *chunk], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=tmp_path) for chunk in chunks if chunk]
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"worker died ({proc.returncode}): {err[-3000:]}"
        for line in out.splitlines():
            row = json.loads(line)
            if "peak_rss_kib" in row:
                peaks.append(row["peak_rss_kib"])
            else:
                results.append(row)
    assert len(results) == 3 * len(files)
    bad = [r for r in results if r["outcome"] in ("traceback", "timeout")]
    report = "\n\n".join(f"{what[r['file']]} [{r['step']}] {r['outcome']}:\n{r['detail']}" for r in bad[:5])
    assert not bad, f"{len(bad)} of {len(results)} runs failed, e.g.:\n{report}"
    for r in results:
        if r["outcome"] == "error":
            assert r["detail"] and "\n" not in r["detail"], r
    counts = {o: sum(r["outcome"] == o for r in results) for o in ("ok", "error", "skipped")}
    print(f"cfg mutation fuzz: {len(files)} mutants x 3 steps: {counts}; peak RSS per worker "
          f"{max(peaks) / 1024:.0f} MiB (bound: +{BOUND >> 20} MiB address space)")
