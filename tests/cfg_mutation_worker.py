"""Worker of tests/test_cfg_mutation_fuzz.py (run as a subprocess, not collected by pytest).

Usage: python cfg_mutation_worker.py BOUND_BYTES TIME_LIMIT_S FILE...

After importing darkpy it caps its own address space (RLIMIT_AS) at what it uses then plus BOUND_BYTES,
and runs, for each FILE (a mutated cfg), `darkpy cfg check FILE`, `darkpy summary FILE` and, when
the network is small (or larger than the machine: then the build must refuse it), a real build (`load_network`) — each under an alarm of
TIME_LIMIT_S. It prints one JSON line per FILE and step: {"file", "step", "outcome", "detail"} where
outcome is "ok", "error" (a one-line darkpy error: exit status 1), "traceback" or "timeout". Then a
last line {"peak_rss_kib": ...}.
"""
from __future__ import annotations

import json
import resource
import signal
import sys
import traceback
import warnings


class _Timeout(BaseException):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def main() -> None:
    bound, limit = int(sys.argv[1]), float(sys.argv[2])
    files = sys.argv[3:]
    from click.testing import CliRunner

    from darkpy.cfg import CfgWarning, load_cfg
    from darkpy.cli import main as cli
    from darkpy.errors import DarkpyError
    from darkpy.memory import network_needs, physical_memory
    from darkpy.network import Network, load_network

    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + bound, resource.getrlimit(resource.RLIMIT_AS)[1]))
    signal.signal(signal.SIGALRM, _alarm)
    runner = CliRunner()
    warnings.simplefilter("ignore")

    def report(path, step, outcome, detail=""):
        print(json.dumps({"file": path, "step": step, "outcome": outcome, "detail": detail[-2000:]}),
              flush=True)

    for path in files:
        for step, args in (("cfg check", ["cfg", "check", path]), ("summary", ["summary", path])):
            signal.setitimer(signal.ITIMER_REAL, limit)
            try:
                r = runner.invoke(cli, args, catch_exceptions=True)
                signal.setitimer(signal.ITIMER_REAL, 0)
            except _Timeout:
                report(path, step, "timeout")
                continue
            if isinstance(r.exception, _Timeout):
                report(path, step, "timeout")
            elif r.exception is not None and not isinstance(r.exception, SystemExit):
                report(path, step, "traceback", "".join(traceback.format_exception(*r.exc_info)))
            else:
                out = (r.stdout + getattr(r, "stderr", "")).strip().splitlines()
                report(path, step, "ok" if r.exit_code == 0 else "error", out[-1] if out else "")
        # a real build, for networks that fit in a small budget
        signal.setitimer(signal.ITIMER_REAL, limit)
        try:
            try:
                doc = load_cfg(path)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", CfgWarning)
                    shapes = Network(doc, batch=1, shapes_only=True)
                total, _, _ = network_needs(shapes.layers, 1, shapes.dtype)
                if bound // 4 < total <= (physical_memory() or 0):       # would fit the machine, not the bound
                    outcome, detail = "skipped", f"needs {total} bytes"
                else:
                    load_network(doc, batch=1)
                    outcome, detail = "ok", ""
            except DarkpyError as e:
                outcome, detail = "error", str(e)
            signal.setitimer(signal.ITIMER_REAL, 0)
        except _Timeout:
            outcome, detail = "timeout", ""
        except BaseException:  # noqa: BLE001
            signal.setitimer(signal.ITIMER_REAL, 0)
            outcome, detail = "traceback", traceback.format_exc()
        report(path, "build", outcome, detail)
    print(json.dumps({"peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}), flush=True)


if __name__ == "__main__":
    main()
