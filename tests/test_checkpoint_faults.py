"""Checkpoints and the backup folder under faults: a full disk, a second Ctrl-C during a write, stale
temp files, two runs on one folder (the lock), and SIGKILLs at random instants (the soak test).

The soak test kills a real `darkpy train` subprocess at random instants (most land inside a checkpoint
write: it saves every iteration) and checks after every kill that the newest pair is consistent and
byte-identical to the same iteration of an uninterrupted run, so the resume from it is exact. It makes
SOAK_KILLS kills (4 by default; `DARKPY_SOAK_KILLS=40` for a longer pass).
"""
from __future__ import annotations

import errno
import io
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import darkpy.atomic as A
import darkpy.checkpoint as C
from darkpy.network import load_network
from darkpy.progress import Progress, parse_line
from test_train import make_project, run

ROOT = Path(__file__).resolve().parents[1]
SOAK_KILLS = int(os.environ.get("DARKPY_SOAK_KILLS", "4"))


@pytest.fixture
def proj(tmp_path):
    return make_project(tmp_path)


def _pair(backup: Path, name: str = "tiny_last") -> tuple[bytes, bytes]:
    return (backup / f"{name}.weights").read_bytes(), (backup / f"{name}.state").read_bytes()


def _listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# -- a full disk ---------------------------------------------------------------------------------------

class _FullDisk:
    """A file that takes `room` bytes, then fails like a full disk."""

    def __init__(self, f, room: int):
        self.f, self.room = f, room

    def write(self, b):
        n = len(memoryview(b).cast("B"))
        if n > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= n
        return self.f.write(b)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()
        return False


@pytest.mark.parametrize("room", [0, 100, 2000])     # fails in the weights' file or in the state's
def test_disk_full_keeps_the_previous_pair_and_names_the_file(proj, monkeypatch, room):
    run(proj, max_batches=2, save_last=1)
    b = Path(proj.backup)
    before, listing = _pair(b), _listing(b)
    net = load_network(proj.cfg, weights=b / "tiny_last.weights")
    monkeypatch.setattr(A, "_open", lambda p, mode: _FullDisk(open(p, mode), room))
    with pytest.raises(A.DiskFullError) as e:
        C.save_checkpoint(net, str(b / "tiny_last.weights"), {"iteration": 3})
    msg = str(e.value)
    assert "\n" not in msg and "no space left on device" in msg and " free in " in msg
    assert str(b / "tiny_last") in msg, msg
    assert _pair(b) == before and _listing(b) == listing, "the old pair is intact, no temp file is left"


def test_disk_full_during_training_is_one_cli_line(proj, monkeypatch):
    from click.testing import CliRunner

    from darkpy.cli import main

    run(proj, max_batches=2, save_last=1)
    b = Path(proj.backup)
    before = _pair(b)
    monkeypatch.setattr(A, "_open", lambda p, mode: _FullDisk(open(p, mode), 50))
    r = CliRunner().invoke(main, ["train", proj.cfg, "--data", proj.data, "--weights",
                                  str(b / "tiny_last.weights"), "--max-batches", "4", "--progress", "none"])
    assert r.exit_code == 1
    err = r.stderr.strip().splitlines()[-1] if hasattr(r, "stderr") else r.output.strip().splitlines()[-1]
    assert err.startswith("error: ") and "no space left on device" in err and "tiny_" in err, err
    assert _pair(b) == before
    assert not [p for p in b.iterdir() if ".tmp" in p.name]


# -- signals during a write ----------------------------------------------------------------------------

def test_a_second_ctrl_c_during_a_write_waits_for_the_pair(proj, monkeypatch):
    run(proj, max_batches=2, save_last=1)
    b = Path(proj.backup)
    net = load_network(proj.cfg, weights=b / "tiny_last.weights")
    real_open = A._open

    def open_and_interrupt(p, mode):      # Ctrl-C lands while the weights' temp file is being written
        os.kill(os.getpid(), signal.SIGINT)
        return real_open(p, mode)

    monkeypatch.setattr(A, "_open", open_and_interrupt)
    net.seen += 8
    with pytest.raises(KeyboardInterrupt):
        C.save_checkpoint(net, str(b / "tiny_last.weights"), {"iteration": 3})
    monkeypatch.setattr(A, "_open", real_open)
    # the interrupt arrived after the pair was complete: new, consistent, no temp file
    assert C.peek_state(str(b / "tiny_last.weights"))["iteration"] == 3
    assert not [p for p in b.iterdir() if ".tmp" in p.name or p.name.count(".") > 1]


def test_stale_chart_and_other_temp_files_of_dead_pids_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    mine = os.getpid()
    for name in (f"chart.png.tmp{dead}", f"bad_label.list.tmp{dead}", f"tiny_log.csv.tmp{dead}",
                 f"tiny_last.weights.tmp{dead}", f"tiny_last.state.tmp{dead}", f"chart.png.tmp{mine}",
                 f"notes.txt.tmp{dead}"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "tiny_last.0badc0de.state").write_bytes(b"x")      # a pending state whose weights never came
    removed = C.remove_stale_temp_files(tmp_path, "tiny")
    assert len(removed) == 5
    assert _listing(tmp_path) == sorted([f"chart.png.tmp{mine}", f"notes.txt.tmp{dead}"])


# -- the lock ------------------------------------------------------------------------------------------

_HOLDER = """
import sys, time
from darkpy.checkpoint import BackupLock
lock = BackupLock(sys.argv[1])
print("locked", flush=True)
time.sleep(60)
"""


def _hold_lock(folder: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-c", _HOLDER, str(folder)], env=env, stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == "locked"
    return p


def test_second_run_on_a_backup_folder_is_refused_then_a_stale_lock_is_taken_over(proj):
    b = Path(proj.backup)
    b.mkdir()
    holder = _hold_lock(b)
    try:
        with pytest.raises(C.BackupLockedError) as e:
            run(proj, max_batches=2)
        msg = str(e.value)
        assert f"pid {holder.pid}" in msg and "BackupLock" in msg and str(b) in msg, msg
        assert not (b / "tiny_log.csv").exists(), "the refused run wrote nothing"
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    out = io.StringIO()
    r = run(proj, max_batches=2, progress=Progress("lines", stream=out))
    assert r.iteration == 2
    assert "took over the stale lock" in out.getvalue() and f"pid {holder.pid}" in out.getvalue()
    assert not (b / C.LOCK_NAME).exists(), "a run that ends removes its lock"


def test_lock_in_process_and_release(tmp_path):
    with C.BackupLock(tmp_path) as lock:
        assert f"pid {os.getpid()}" in (tmp_path / C.LOCK_NAME).read_text()
        with pytest.raises(C.BackupLockedError, match=f"pid {os.getpid()}"):
            C.BackupLock(tmp_path)
        assert lock._fd is not None
    notes = []
    C.BackupLock(tmp_path, notify=notes.append).release()
    assert notes == [] and not (tmp_path / C.LOCK_NAME).exists()


# -- the bad-label summary line ----------------------------------------------------------------------

def test_bad_label_summary_counts_lines_and_files():
    from darkpy.datasets import DetectionData

    d = DetectionData.__new__(DetectionData)
    d.bad_labels = ["a.txt:1: x", "a.txt:3: y", "b.txt:2: z", "img.png: no label file (looked for q)"]
    assert d.bad_labels_summary("backup/bad_label.list") == (
        "3 label lines skipped in 2 files, 1 image without a label file; see backup/bad_label.list")


# -- SIGKILL soak --------------------------------------------------------------------------------------

@pytest.mark.slow
def test_sigkill_soak_newest_pair_resumes_exactly(tmp_path):
    """Kill `darkpy train` at random instants; after each kill the newest pair is consistent and equal,
    byte for byte, to the same iteration of an uninterrupted run (so every resume was exact)."""
    M = 60 + 10 * SOAK_KILLS
    ref = make_project(tmp_path / "ref")
    run(ref, max_batches=M, save_last=1, save_every=1)           # tiny_<k>.weights/.state for every k
    proj = make_project(tmp_path / "soak")
    Path(proj.data).write_text(Path(proj.data).read_text() + "savelast=1\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    b, rb = Path(proj.backup), Path(ref.backup)
    last = b / "tiny_last.weights"
    rng = random.Random(12345)
    kills = checked = mid_write = 0
    while kills < SOAK_KILLS:
        cmd = [sys.executable, "-m", "darkpy", "train", proj.cfg, "--data", proj.data, "--max-batches",
               str(M), "--progress", "lines"]
        if last.exists():
            cmd += ["--weights", str(last)]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                cwd=tmp_path)
        try:
            deadline = time.time() + 120
            while time.time() < deadline:           # the first iteration line: past start-up
                line = proc.stdout.readline()
                if not line or parse_line(line) is not None:
                    break
            time.sleep(rng.uniform(0.0, 0.25))
            finished = proc.poll() is not None
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.kill()
            proc.stdout.close()
            proc.wait()
        if finished:
            break
        kills += 1
        leftovers = [x.name for x in b.iterdir() if ".tmp" in x.name or C._PENDING.match(x.name)]
        mid_write += bool(leftovers)                  # the kill landed inside a checkpoint write
        C.remove_stale_temp_files(b, "tiny")          # what the next run does first
        meta = C.peek_state(str(last))
        assert meta is not None, f"kill {kills}: the newest pair is not consistent"
        k = meta["iteration"]
        assert last.read_bytes() == (rb / f"tiny_{k}.weights").read_bytes(), f"kill {kills}: iteration {k}"
        net = load_network(proj.cfg, weights=last)
        mine, why = C.read_state(C.state_path(last), net, C.file_crc(last))
        ref_net = load_network(ref.cfg, weights=rb / f"tiny_{k}.weights")
        theirs, _ = C.read_state(str(rb / f"tiny_{k}.state"), ref_net, C.file_crc(rb / f"tiny_{k}.weights"))
        assert mine is not None, why
        assert mine["avg_loss"] == theirs["avg_loss"] and mine["updates"] == theirs["updates"]
        for la, lb in zip(net.layers, ref_net.layers):
            for pa, pb in zip(la.params, lb.params):
                np.testing.assert_array_equal(pa.grad, pb.grad)
        assert [x for x in b.iterdir() if ".tmp" in x.name] == []
        checked += 1
    assert checked == kills and kills >= min(SOAK_KILLS, 2), f"only {kills} kills landed"
    print(f"soak: {kills} SIGKILLs ({mid_write} inside a checkpoint write, leaving a temp or pending file), "
          f"every newest pair consistent and exact")
