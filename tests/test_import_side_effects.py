"""Importing darkpy changes nothing outside darkpy; only the `darkpy` command sets its own process's
runtime settings (darkpy/process.py).

Each check runs in a fresh interpreter, started without the variables the command would set, so
what the test process itself has imported or set cannot hide a change.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from darkpy.process import COMMAND_ENV, USER_INSTEAD, set_command_environment

ROOT = Path(__file__).resolve().parents[1]

TINY_CFG = """[net]
batch=2
width=8
height=8
channels=3
[convolutional]
batch_normalize=1
filters=4
size=3
stride=1
pad=1
activation=leaky
[maxpool]
size=2
stride=2
[connected]
output=3
activation=linear
[softmax]
"""

# Snapshot everything another library could see, import darkpy, build and run a tiny network,
# snapshot again; then start a child process and read the environment it sees.
PROBE = r"""
import json, os, subprocess, sys, threading, warnings
import numpy as np
import numba
try:
    from threadpoolctl import threadpool_info
except ImportError:                     # optional: BLAS thread counts are then not compared
    def threadpool_info():
        return []

def snapshot():
    return {"environ": dict(os.environ), "filters": [repr(f) for f in warnings.filters],
            "showwarning": repr(warnings.showwarning), "threads": threading.active_count(),
            "numba_threads": numba.get_num_threads(), "np_err": np.geterr(),
            "blas_threads": [i["num_threads"] for i in threadpool_info()],
            "switch": sys.getswitchinterval()}

before = snapshot()
import darkpy
net = darkpy.load_network(sys.argv[1], batch=2)
net.forward(np.random.default_rng(0).random((2, 3, 8, 8), dtype=np.float32))
after = snapshot()
child = subprocess.run([sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"],
                       capture_output=True, text=True, check=True).stdout
print(json.dumps({"before": before, "after": after, "child": json.loads(child)}))
"""


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in COMMAND_ENV and k not in USER_INSTEAD.values()}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def test_import_and_load_network_change_nothing_outside_darkpy(tmp_path):
    cfg = tmp_path / "tiny.cfg"
    cfg.write_text(TINY_CFG)
    env = _clean_env()
    r = subprocess.run([sys.executable, "-c", PROBE, str(cfg)], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    before, after = got["before"], got["after"]
    for key in before:
        assert after[key] == before[key], f"importing darkpy changed {key}"
    for name in COMMAND_ENV:
        assert name not in after["environ"]
    # a process started after `import darkpy` sees the environment from before it
    child = {k: v for k, v in got["child"].items() if k not in ("_", "SHLVL")}
    parent = {k: v for k, v in before["environ"].items() if k not in ("_", "SHLVL")}
    assert child == parent


def test_importing_the_cli_loads_no_numpy():
    """The command sets its variables before numpy or numba load: importing darkpy.cli (and so
    darkpy) must not load them."""
    code = "import sys, darkpy.cli; print(sorted(m for m in ('numpy', 'numba') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_clean_env(), capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_command_sets_its_own_environment_before_numpy_loads():
    code = r"""
import os, sys
import darkpy.process as p
real = p.set_command_environment
def spy(*args, **kwargs):
    assert "numpy" not in sys.modules, "numpy loaded before the command's settings"
    return real(*args, **kwargs)
p.set_command_environment = spy
sys.argv = ["darkpy", "summary", "cfg/digits.cfg"]
from darkpy.cli import entry
try:
    entry()
except SystemExit as e:
    assert not e.code, e.code
print("ENV", os.environ["GOMP_SPINCOUNT"], os.environ["OPENBLAS_THREAD_TIMEOUT"],
      os.environ.get("OMP_WAIT_POLICY", "unset"), file=sys.stderr)
"""
    env = _clean_env()
    env["OPENBLAS_THREAD_TIMEOUT"] = "7"            # a value the user set is kept
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "ENV 30000 7 unset" in r.stderr


def test_set_command_environment_keeps_values_already_set():
    env = {"OPENBLAS_THREAD_TIMEOUT": "7", "GOMP_SPINCOUNT": "0"}
    assert set_command_environment(env) == {"GOMP_SPINCOUNT": "0", "OPENBLAS_THREAD_TIMEOUT": "7",
                                            "OMP_WAIT_POLICY": "unset"}
    assert env == {"OPENBLAS_THREAD_TIMEOUT": "7", "GOMP_SPINCOUNT": "0"}


def test_a_wait_policy_the_user_set_is_not_overridden_by_a_spin_count():
    """libgomp takes GOMP_SPINCOUNT over OMP_WAIT_POLICY's spinning, so with a policy set the
    command sets no spin count: PASSIVE still means sleeping workers, ACTIVE spinning ones."""
    for policy in ("PASSIVE", "ACTIVE"):
        env = {"OMP_WAIT_POLICY": policy}
        assert set_command_environment(env) == {"GOMP_SPINCOUNT": "unset", "OPENBLAS_THREAD_TIMEOUT": "4",
                                                "OMP_WAIT_POLICY": policy}
        assert env == {"OMP_WAIT_POLICY": policy, "OPENBLAS_THREAD_TIMEOUT": "4"}
    env = {}
    set_command_environment(env)
    assert env == {"GOMP_SPINCOUNT": "30000", "OPENBLAS_THREAD_TIMEOUT": "4"}
