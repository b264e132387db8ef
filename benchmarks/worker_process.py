"""A contender's worker process as the suite's parent sees it (`engine.Phase` starts one per sample):
started with the clean environment of `environment.worker_env`, asked one JSON request at a time
over its pipes, and made sure to have exited when closed. The process itself is
benchmarks/worker.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from .environment import ROOT, worker_env


class Unavailable(Exception):
    """A contender cannot run this phase (say why in the results)."""


class WorkerError(RuntimeError):
    pass


class Worker:
    """A contender's process, asked one request at a time; `close` makes sure it has exited."""

    def __init__(self, kind: str, opts):
        """opts: the suite's `engine.Options` (its threads and how the darkpy worker runs)."""
        self.kind = kind
        self.log = tempfile.TemporaryFile(mode="w+")
        cmd = [sys.executable, "-m", "benchmarks.worker", kind]
        if kind == "darkpy" and opts.darkpy_as == "library":
            cmd += ["--darkpy-as", "library"]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=worker_env(opts.threads), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True)

    def call(self, op: str, **args) -> dict:
        try:
            self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            self.log.seek(0)
            raise WorkerError(f"{self.kind} worker died during {op}:\n{self.log.read()[-3000:]}")
        reply = json.loads(line)
        if "error" in reply:
            raise WorkerError(f"{self.kind} {op} failed:\n{reply['error']}")
        return reply

    def close(self) -> bool:
        """Ask the process to quit, wait for it, and confirm it is gone (True when it exited cleanly)."""
        clean = True
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
                clean = False
                self.proc.kill()
                self.proc.wait()
        try:
            os.kill(self.proc.pid, 0)       # reaped by wait(): the pid must be gone
            clean = False
        except ProcessLookupError:
            pass
        except PermissionError:         # the pid was reused by someone else's process
            pass
        self.log.close()
        return clean and self.proc.returncode == 0
