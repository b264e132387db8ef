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

import pytest

from darkpy.process import COMMAND_ENV, openblas_coretype, set_command_environment

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
    env = {k: v for k, v in os.environ.items() if k not in COMMAND_ENV}
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
print("ENV", os.environ["OMP_WAIT_POLICY"], os.environ["OPENBLAS_THREAD_TIMEOUT"], file=sys.stderr)
"""
    env = _clean_env()
    env["OPENBLAS_THREAD_TIMEOUT"] = "7"            # a value the user set is kept
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "ENV PASSIVE 7" in r.stderr


def test_set_command_environment_keeps_values_already_set():
    env = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert set_command_environment(env, cpuinfo="") == {"OMP_WAIT_POLICY": "ACTIVE", "OPENBLAS_THREAD_TIMEOUT": "4"}
    assert env == {"OMP_WAIT_POLICY": "ACTIVE", "OPENBLAS_THREAD_TIMEOUT": "4"}


AVX512 = "fpu sse4_2 avx avx2 fma avx512f avx512dq avx512cd avx512bw avx512vl"


def _cpuinfo(vendor: str, family: int, flags: str) -> str:
    block = f"processor\t: {{}}\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: 2\nflags\t\t: {flags}\n"
    return block.format(0) + "\n" + block.format(1).replace(flags, "fpu")   # only the first block counts


@pytest.mark.parametrize("vendor, family, flags, expected", [
    ("AuthenticAMD", 26, AVX512, "SkylakeX"),                 # Zen 5: OpenBLAS 0.3.31 falls back to Haswell
    ("AuthenticAMD", 27, AVX512 + " avx512_bf16", "SkylakeX"),
    ("AuthenticAMD", 25, AVX512, None),                       # Zen 4: OpenBLAS picks its own AVX-512 kernels
    ("AuthenticAMD", 26, AVX512.replace(" avx512vl", ""), None),   # a subset missing: its kernels would fault
    ("AuthenticAMD", 26, "fpu sse4_2 avx avx2 fma", None),
    ("GenuineIntel", 6, AVX512, None),
])
def test_openblas_coretype_only_for_avx512_cpus_openblas_does_not_know(vendor, family, flags, expected):
    info = _cpuinfo(vendor, family, flags)
    assert openblas_coretype(info) == expected
    env = {}
    got = set_command_environment(env, cpuinfo=info)
    assert env.get("OPENBLAS_CORETYPE") == expected
    assert got == env
    assert openblas_coretype("") is None and openblas_coretype("garbage\n: :\n") is None


def test_openblas_coretype_set_by_the_user_is_kept():
    env = {"OPENBLAS_CORETYPE": "Haswell"}
    set_command_environment(env, cpuinfo=_cpuinfo("AuthenticAMD", 26, AVX512))
    assert env["OPENBLAS_CORETYPE"] == "Haswell"


def test_numpy_runs_the_kernels_the_command_chose():
    """On a machine where the command picks OpenBLAS's kernels, numpy's OpenBLAS really runs them."""
    pytest.importorskip("threadpoolctl")
    coretype = openblas_coretype()
    if coretype is None:
        pytest.skip("this CPU keeps OpenBLAS's own kernel choice")
    code = ("from darkpy.process import set_command_environment; set_command_environment(); "
            "import numpy; from threadpoolctl import threadpool_info; "
            "print([i.get('architecture') for i in threadpool_info() if i['internal_api'] == 'openblas'])")
    env = {k: v for k, v in _clean_env().items() if k != "OPENBLAS_CORETYPE"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True, timeout=300).stdout
    assert coretype in out, out
