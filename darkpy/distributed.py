"""Data-parallel training over MPI: the communicator the training loop is handed, and `--procs`.

`world()` returns the job's communicator. A plain run (and `mpiexec -n 1`) gets `SingleProcess`:
rank 0 of 1, every collective a no-op, and mpi4py is never imported, so nothing costs or changes.
Only a process started by an MPI launcher with more than one rank (mpiexec/hydra, Open MPI, PMIx
set the variables in `LAUNCHER_RANK_VARS`/`LAUNCHER_SIZE_VARS`) gets an `MpiCommunicator`.

A communicator offers what one update needs (darkpy/update_sync.py uses it): `allreduce(flat)`, the
in-place sum of one contiguous float buffer; `allgather(row)`, every rank's small row in rank order;
`bcast(obj)`; and `abort()`. Collectives wait for the slowest rank without spinning a core: MPICH's
blocking calls poll, which on a loaded or oversubscribed host steals the CPU the late rank needs (a
rank waiting 2 s used 0.84 s of CPU), so each collective first waits in a polled `Ibarrier` (about
0.03 s of CPU per second of waiting), then runs at full speed once every rank has arrived.

`launch(argv, procs)` is `darkpy train CFG --procs N`: the venv's own `mpiexec` (the `mpich`
wheel's) running `python -m mpi4py -m darkpy train ...`, so that an uncaught error on one rank
aborts the whole job; Ctrl-C is passed to mpiexec once, which hands it to every rank.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from .errors import DarkpyError

#: Set in every rank's environment by the MPI launchers darkpy knows: MPICH's hydra (PMI_RANK,
#: PMI_SIZE, MPI_LOCALNRANKS), Open MPI (OMPI_COMM_WORLD_*), PMIx launchers such as Slurm (PMIX_RANK).
LAUNCHER_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
LAUNCHER_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")
ABORT_GRACE_S = 1.0     # how long a failing rank other than 0 waits before it reports and aborts
INSTALL_HINT = "pip install 'darkpy[mpi]' (mpi4py and the mpich wheel), or mpi4py built against your cluster's MPI"


class MpiError(DarkpyError):
    """MPI is needed but missing or unusable, or the ranks disagree."""


class SingleProcess:
    """The communicator of a run with one process: rank 0 of 1; every collective returns its input."""

    rank = 0
    size = 1
    local_size = 1
    wait_seconds = 0.0
    transfer_seconds = 0.0

    def allreduce(self, flat: np.ndarray) -> np.ndarray:
        return flat

    def allgather(self, row: np.ndarray) -> np.ndarray:
        return np.asarray(row)[None]

    def bcast(self, obj: Any, root: int = 0) -> Any:
        return obj

    def allgather_objects(self, obj: Any) -> list:
        return [obj]

    def barrier(self) -> None:
        pass

    def abort(self, status: int = 1) -> None:
        raise SystemExit(status)

    def __repr__(self) -> str:
        return "<SingleProcess>"


class MpiCommunicator:
    """COMM_WORLD of an MPI job (see the module docstring for how collectives wait).
    `wait_seconds`: time spent waiting for the other ranks to arrive; `transfer_seconds`: time in
    the collectives themselves once all had (both summed over the run, for benchmarks)."""

    def __init__(self, comm, mpi):
        self.comm, self._mpi = comm, mpi
        self.wait_seconds = self.transfer_seconds = 0.0
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        local = comm.Split_type(mpi.COMM_TYPE_SHARED)
        self.local_size = local.Get_size()      # ranks on this host (threads are shared between them)
        local.Free()

    def _arrive(self) -> float:
        """Return once every rank has reached this point, mostly asleep while waiting (returns the
        time it returned)."""
        t0 = time.perf_counter()
        req = self.comm.Ibarrier()
        spin_until = t0 + 2e-3      # ranks in step: answer within microseconds
        pause = 5e-5
        while not req.Test():
            if time.perf_counter() > spin_until:
                time.sleep(pause)
                pause = min(pause * 2, 1e-3)
        t1 = time.perf_counter()
        self.wait_seconds += t1 - t0
        return t1

    def allreduce(self, flat: np.ndarray) -> np.ndarray:
        """Sum `flat` (one contiguous array) over the ranks, in place; every rank gets the sum."""
        t = self._arrive()
        self.comm.Allreduce(self._mpi.IN_PLACE, flat, op=self._mpi.SUM)
        self.transfer_seconds += time.perf_counter() - t
        return flat

    def allgather(self, row: np.ndarray) -> np.ndarray:
        """Every rank's `row` (same size and dtype on every rank), as rows of a (size, n) array."""
        row = np.ascontiguousarray(row)
        out = np.empty((self.size, row.size), row.dtype)
        t = self._arrive()
        self.comm.Allgather(row, out)
        self.transfer_seconds += time.perf_counter() - t
        return out

    def bcast(self, obj: Any, root: int = 0) -> Any:
        self._arrive()
        return self.comm.bcast(obj, root=root)

    def allgather_objects(self, obj: Any) -> list:
        self._arrive()
        return self.comm.allgather(obj)

    def barrier(self) -> None:
        """Wait (mostly asleep) until every rank is here."""
        self._arrive()

    def abort(self, status: int = 1) -> None:
        """End every rank of the job now. MPICH's MPI_Abort asks the launcher to kill the job and
        returns; this process then exits at once. The job's shared-memory segments, which an abort
        leaves in /dev/shm, are unlinked first (the ranks still mapping them keep their memory)."""
        sys.stdout.flush()
        sys.stderr.flush()
        for path in mapped_shm_segments():
            try:
                os.unlink(path)
            except OSError:
                pass
        self.comm.Abort(status)
        os._exit(status)

    def __repr__(self) -> str:
        return f"<MpiCommunicator rank {self.rank} of {self.size}>"


SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "mpich_shm_"       # MPICH's intranode segments


def mapped_shm_segments(pid: int | str = "self") -> list[str]:
    """MPICH's shared-memory segments this process has mapped (Linux; empty elsewhere)."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return []
    found = []
    for line in maps.splitlines():
        fields = line.split(None, 5)
        path = fields[5].strip().removesuffix(" (deleted)") if len(fields) == 6 else ""
        if path.startswith(f"{SHM_DIR}/{SHM_PREFIX}") and path not in found:
            found.append(path)
    return found


def shm_segments() -> set[str]:
    """MPICH's segments in /dev/shm now."""
    try:
        return {str(p) for p in SHM_DIR.glob(f"{SHM_PREFIX}*")}
    except OSError:
        return set()


def remove_orphaned_shm(before: set[str], tries: int = 3) -> list[str]:
    """Remove MPICH segments that appeared since `before` and that no process maps any more: what a
    job whose rank was killed leaves behind (its last processes may still be exiting: up to `tries`
    looks, 0.2 s apart). Returns the removed paths."""
    removed: list[str] = []
    for attempt in range(tries):
        new = shm_segments() - before
        for proc in Path("/proc").glob("[0-9]*"):
            if not new:
                break
            new -= set(mapped_shm_segments(proc.name))
        for path in sorted(new):
            try:
                os.unlink(path)
                removed.append(path)
            except OSError:
                pass
        if not shm_segments() - before or attempt == tries - 1:
            break
        time.sleep(0.2)
    return removed


def launcher_size(environ: os._Environ | dict | None = None) -> int | None:
    """The job size an MPI launcher announced in the environment: None when not launched by one
    (no rank variable set), 0 when launched but the size is not in the environment."""
    env = os.environ if environ is None else environ
    if not any(v in env for v in LAUNCHER_RANK_VARS + LAUNCHER_SIZE_VARS):
        return None
    for var in LAUNCHER_SIZE_VARS[:2]:
        if env.get(var, "").isdigit():
            return int(env[var])
    return 0


def world(environ: os._Environ | dict | None = None):
    """The communicator of this process: `SingleProcess` unless an MPI launcher started it with
    several ranks (only then is mpi4py imported)."""
    size = launcher_size(environ)
    if size is None or size == 1:
        return SingleProcess()
    mpi = import_mpi()
    comm = MpiCommunicator(mpi.COMM_WORLD, mpi)
    return comm if comm.size > 1 else SingleProcess()


def import_mpi():
    """`mpi4py.MPI`, or an `MpiError` saying what to install."""
    if "mpi4py.MPI" not in sys.modules:
        try:
            import mpi4py
        except ImportError:
            raise MpiError(f"this process was started by an MPI launcher but mpi4py is not installed: "
                           f"{INSTALL_HINT}") from None
        # only the main thread calls MPI; a lower thread level than mpi4py's default (multiple)
        # lets MPICH skip its locks
        mpi4py.rc.thread_level = "funneled"
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError) as e:
        raise MpiError(f"mpi4py cannot load an MPI library ({str(e).splitlines()[0] if str(e) else type(e).__name__}): "
                       f"{INSTALL_HINT}") from None
    return MPI


def threads_per_rank(threads: int, comm) -> int:
    """The thread count for this rank: `threads` when set, else (0 = all cores) this host's cores
    shared among the ranks on it (at least 1)."""
    if threads > 0 or comm.local_size <= 1:
        return threads
    try:
        cores = len(os.sched_getaffinity(0))        # the cores this process may run on
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, cores // comm.local_size)


@contextmanager
def abort_job_on_error(comm, debug: bool = False) -> Iterator[None]:
    """With several ranks, an exception on one ends the whole job within seconds: the rank prints
    its error on one line (`error: rank R: ...`; with `debug`, the traceback) and calls MPI_Abort,
    so the other ranks never wait forever in a collective. With one process, a no-op."""
    if comm.size == 1:
        yield
        return
    try:
        yield
    except SystemExit:
        raise
    except BaseException as e:      # noqa: BLE001  (any error must end the job, not hang it)
        if debug or not isinstance(e, (DarkpyError, OSError, KeyboardInterrupt)):
            import traceback
            traceback.print_exc()
        message = "interrupted" if isinstance(e, KeyboardInterrupt) else _one_line(e)
        if comm.rank != 0:
            # an error every rank meets (a bad cfg or data file) is then reported once, by rank 0,
            # whose abort ends this rank before it prints
            time.sleep(ABORT_GRACE_S)
        print(f"error: rank {comm.rank}: {message}", file=sys.stderr, flush=True)
        comm.abort(130 if isinstance(e, KeyboardInterrupt) else 1)


def _one_line(e: BaseException) -> str:
    if isinstance(e, OSError) and not isinstance(e, DarkpyError):
        name = f"{e.filename}: " if getattr(e, "filename", None) else ""
        return f"{name}{e.strerror or e}"
    text = str(e) or type(e).__name__
    return text if isinstance(e, DarkpyError) else f"{type(e).__name__}: {text}"


# -- `darkpy train --procs N` ---------------------------------------------------------------------------

def find_mpiexec() -> str:
    """The `mpiexec` of this Python environment (the mpich wheel puts it beside the interpreter),
    else the first on PATH; an `MpiError` saying what to install when there is none."""
    dirs = [Path(sysconfig.get_path("scripts")), Path(sys.executable).parent]
    try:
        from importlib.metadata import PackageNotFoundError, distribution
        try:
            for f in distribution("mpich").files or ():
                if f.name == "mpiexec":
                    dirs.append(Path(f.locate()).parent)
        except PackageNotFoundError:
            pass
    except ImportError:  # pragma: no cover
        pass
    for d in dirs:
        exe = d / "mpiexec"
        if exe.is_file() and os.access(exe, os.X_OK):
            return str(exe)
    found = shutil.which("mpiexec")
    if found:
        return found
    raise MpiError(f"--procs needs an MPI launcher (mpiexec) and none was found beside {sys.executable} "
                   f"or on PATH: {INSTALL_HINT}")


def launch_command(argv: Sequence[str], procs: int, mpiexec: str | None = None) -> list[str]:
    """The command `--procs` runs: `mpiexec -n N python -m mpi4py -m darkpy ARGV...`."""
    return [mpiexec or find_mpiexec(), "-n", str(procs), sys.executable, "-m", "mpi4py", "-m", "darkpy",
            *argv]


def launch(argv: Sequence[str], procs: int, env: dict | None = None) -> int:
    """Run `darkpy ARGV` on `procs` ranks of this host and wait; returns mpiexec's exit status.

    Before starting anything, checks that mpi4py loads (so a missing MPI library is one clear error,
    not N tracebacks). mpiexec runs in its own session, so a terminal's Ctrl-C reaches this process
    only; each SIGINT/SIGTERM received here is passed on to mpiexec as one SIGINT, which mpiexec hands
    to every rank: the first makes the ranks stop after the iteration in progress and rank 0 save
    `_last` (exit status 0), a second makes mpiexec abort the job."""
    import_mpi_in_child()
    cmd = launch_command(argv, procs)
    segments = shm_segments()
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)

    def forward(signum, frame):
        try:
            proc.send_signal(signal.SIGINT)
        except ProcessLookupError:
            pass

    old = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            old[sig] = signal.signal(sig, forward)
        except ValueError:          # not the main thread: signals stay as they are
            pass
    try:
        while True:
            try:
                status = proc.wait()
                break
            except KeyboardInterrupt:       # pragma: no cover  (the handler above catches SIGINT)
                forward(signal.SIGINT, None)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    if status != 0:
        remove_orphaned_shm(segments)       # a killed rank's job leaves its segments behind
    return status


def import_mpi_in_child() -> None:
    """Check in a short-lived child that `from mpi4py import MPI` works (importing it here would
    initialise MPI in the launcher itself); an `MpiError` with what to install when it does not."""
    code = "from mpi4py import MPI"
    check = "import mpi4py; mpi4py.rc.initialize = False; " + code     # loads the library, starts nothing
    r = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items()
                            if k not in LAUNCHER_RANK_VARS + LAUNCHER_SIZE_VARS})
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["unknown error"])[-1]
        raise MpiError(f"--procs needs mpi4py with an MPI library, and `{code}` failed ({last}): {INSTALL_HINT}")
