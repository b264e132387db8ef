"""Test helpers: float64 numerical gradients, layer-level gradient checks, golden file loading."""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Callable

import numpy as np

from darkpy.layers.base import State
from darkpy.network import Network, network_from_text


def numerical_grad(f: Callable[[], float], arr: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central differences of scalar f() w.r.t. every element of `arr` (modified in place, restored)."""
    g = np.zeros_like(arr, dtype=np.float64)
    flat = arr.reshape(-1)
    gf = g.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        fp = f()
        flat[i] = old - eps
        fm = f()
        flat[i] = old
        gf[i] = (fp - fm) / (2 * eps)
    return g


@functools.lru_cache(maxsize=None)
def blas_splits_exactly() -> bool:
    """Whether OpenBLAS's sgemm kernels on this machine give a product the same bits whole, on one
    or two of its threads, or split into blocks of rows (multiples of 8) or columns (of 16). Its
    SkylakeX kernels do; its Haswell kernels (AVX2 machines, or any machine with
    OPENBLAS_CORETYPE=Haswell) sum such parts in another order, rounding apart. darkpy's results
    at different thread counts do not rest on it: it cuts a product into parts fixed by the shape
    (darkpy/blas.py, `split_parts`)."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    for m, k, n in ((32, 300, 2048), (144, 300, 100)):
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        with threadpool_limits(1, user_api="blas"):
            one = a @ b
            cols = np.concatenate([a @ b[:, :n // 32 * 16], a @ b[:, n // 32 * 16:]], 1)
            rows = np.concatenate([a[:m // 16 * 8] @ b, a[m // 16 * 8:] @ b], 0)
        with threadpool_limits(2, user_api="blas"):
            two = a @ b
        if not all(np.array_equal(one, c) for c in (cols, rows, two)):
            return False
    return True


#: Why a test of the same bits relaxes to rounding: `blas_splits_exactly` is false here.
BLAS_ROUNDS_APART = ("OpenBLAS's sgemm kernels here (e.g. OPENBLAS_CORETYPE=Haswell) round a product "
                     "split into parts apart from the whole one")


def assert_same_bits(actual, expected, what: str = "", rtol: float = 1e-4) -> None:
    """actual == expected bit for bit where OpenBLAS's products split exactly
    (`blas_splits_exactly`), else within rounding: rtol of expected's largest magnitude. For two
    runs whose GEMMs are cut differently (an inference-only network's kernels against the
    training paths'); runs that differ only in thread counts give the same bits anywhere."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    if blas_splits_exactly():
        np.testing.assert_array_equal(actual, expected, err_msg=what)
        return
    assert actual.shape == expected.shape, what
    assert (np.isfinite(actual) == np.isfinite(expected)).all(), what
    scale = max(float(np.nanmax(np.abs(expected), initial=0.0)), 1e-30)
    err = float(np.nanmax(np.abs(actual.astype(np.float64) - expected), initial=0.0))
    assert err <= rtol * scale, f"{what}: differs by {err:.3g} (scale {scale:.3g}; {BLAS_ROUNDS_APART})"


def assert_close(actual, expected, rtol=1e-5, atol=1e-7, what=""):
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    err = np.abs(actual - expected)
    tol = atol + rtol * np.abs(expected)
    bad = err > tol
    if bad.any():
        i = int(np.argmax(err - tol))
        raise AssertionError(f"{what}: {bad.sum()}/{bad.size} elements differ; worst at flat index {i}: "
                             f"{actual.reshape(-1)[i]!r} vs {expected.reshape(-1)[i]!r} "
                             f"(max abs err {err.max():.3g})")


def layer_gradcheck(cfg_text: str, index: int, *, train: bool = True, seed: int = 0, eps: float = 1e-6,
                    rtol: float = 1e-5, atol: float = 1e-7, check_params: bool = True,
                    input_range=(-1.0, 1.0)) -> Network:
    """Check layer `index`'s backward against central differences, in float64.

    The scalar is L = sum(output * r) for a fixed random r. Darknet's delta is the NEGATIVE gradient,
    so after backward with layer.delta = -r: prev.delta must equal -dL/d(prev.output) and each
    Param.grad must equal -dL/d(Param.value). Every earlier layer's output is perturbed in turn where
    the layer reads it (route/shortcut sources too), by re-running only this layer's forward.
    """
    net = network_from_text(cfg_text, dtype=np.float64)
    rng = np.random.default_rng(seed)
    x = rng.uniform(*input_range, size=net.input.shape)
    net.forward(x, train=train)
    net.allocate_training()     # after an inference forward too: the backward below needs deltas
    layer = net.layers[index]
    r = rng.standard_normal(layer.output.shape)

    def state(delta=None):
        prev = net.layers[index - 1] if index > 0 else None
        return State(input=prev.output if prev is not None else net.input,
                     delta=(prev.delta if prev is not None else None) if delta is None else delta,
                     truth=None, train=train, layers=net.layers, seen=0,
                     rng=np.random.default_rng(seed + 1), net=net)

    def L() -> float:
        layer.forward(state())
        return float((layer.output * r).sum())

    L()  # fixes any train-time randomness to the seeded rng
    for other in net.layers:
        other.delta.fill(0)
    for p in layer.params:
        p.grad.fill(0)
    layer.delta[...] = -r
    layer.forward(state())
    layer.delta[...] = -r
    layer.backward(state())
    analytic = {i: net.layers[i].delta.copy() for i in range(index)}
    pgrads = {p.name: p.grad.copy() for p in layer.params}
    for i in range(index):
        num = numerical_grad(L, net.layers[i].output, eps)
        if np.any(num != 0) or np.any(analytic[i] != 0):
            assert_close(analytic[i], -num, rtol, atol, f"layer {index} input delta into layer {i}")
    if check_params:
        for p in layer.params:
            num = numerical_grad(L, p.value, eps)
            assert_close(pgrads[p.name], -num, rtol, atol, f"layer {index} param {p.name}")
    return net


def golden_dir(kind: str, name: str) -> Path:
    from conftest import shared_path
    return shared_path("golden", kind, name)


def read_f32(path: Path) -> np.ndarray:
    return np.fromfile(path, dtype="<f4")


def golden_meta(d: Path) -> dict:
    return json.loads((d / "meta.json").read_text())


# -- the bundled shapes dataset and detector -----------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
#: cfg/shapes-tiny.cfg's anchors (both [yolo] heads), at its 128 px input
SHAPES_ANCHORS = (16, 22, 28, 36, 44, 54)


def shapes_generator():
    """data/shapes/generate.py as a module (it is a script, not part of a package)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("shapes_generate", ROOT / "data" / "shapes" / "generate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def short_shapes_tiny(path: Path, size: int, iterations: int, net: dict | None = None,
                      yolo: dict | None = None) -> Path:
    """cfg/shapes-tiny.cfg for a short test run, written to `path`: input size x size with the
    anchors scaled to it, `iterations` with burn_in 50 and the steps at 3/4 and 9/10, then any
    other `[net]` keys of `net` and keys of `yolo` set on both [yolo] heads."""
    from darkpy.cfg import load_cfg
    doc = load_cfg(ROOT / "cfg" / "shapes-tiny.cfg")
    keys = {"width": size, "height": size, "max_batches": iterations, "burn_in": 50,
            "steps": f"{iterations * 3 // 4},{iterations * 9 // 10}", **(net or {})}
    for key, value in keys.items():
        doc.set(f"net.{key}", str(value))
    anchors = ", ".join(f"{a * size // 128},{a * size // 128}" for a in SHAPES_ANCHORS)
    for i, sec in enumerate(doc.layers):
        if sec.kind == "yolo":
            assert sec.as_dict()["anchors"].replace(" ", "") == ",".join(f"{a},{a}" for a in SHAPES_ANCHORS)
            doc.set(f"{i}.anchors", anchors)
            for key, value in (yolo or {}).items():
                doc.set(f"{i}.{key}", str(value))
    doc.write(path)
    return path


def assert_epilogue_is_the_separate_pass(forward, B: int, C: int, N: int, P: int, act: str,
                                         seed: int = 3) -> None:
    """forward(y, x, w[, k, off, code]) (a fused 1x1 kernel: y (B, N, P) from x (B, C, P) and w
    (N, C)) with the inference epilogue gives the same bits as without it followed by
    `affine_act_row` over each filter's plane."""
    from darkpy.kernels import activations as A
    from darkpy.kernels.bn import affine_act_row
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, C, P)).astype(np.float32)
    w = rng.standard_normal((N, C)).astype(np.float32)
    k, off = rng.random(N) + 0.5, rng.standard_normal(N)
    code = A.kernel_code(A.code(act), np.float32)
    y, want = np.empty((B, N, P), np.float32), np.empty((B, N, P), np.float32)
    forward(y, x, w, k, off, code)
    forward(want, x, w)
    for b in range(B):
        for f in range(N):
            affine_act_row(want[b, f], k[f], off[f], code)
    assert np.array_equal(y, want)


def assert_path_infers_as_the_others(text: str, batch: int, size: int, path: str, taken: list,
                                     switch, monkeypatch, tol: float = 1e-5) -> list:
    """Two networks of `text` (inputs of 3 x size x size) with the same parameters: inferring with
    shared outputs, the first has the layer attribute `path` set exactly on the layers `taken` says;
    the second, made with the module switch `switch` (module, name) False, on none. Their outputs
    agree within `tol`, before and after layer 1's weights change, and unsharing the first's
    outputs takes the path away. Returns the networks."""
    nets = [network_from_text(text, batch=batch) for _ in range(2)]
    rng = same_random_parameters(nets, size)
    x = rng.random((batch, 3, size, size), dtype=np.float32)
    nets[0].share_outputs()
    assert [getattr(layer, path) for layer in nets[0].layers] == taken
    monkeypatch.setattr(*switch, False)
    nets[1].share_outputs()
    assert not any(getattr(layer, path) for layer in nets[1].layers)
    for _ in range(2):
        got, want = nets[0].predict(x), nets[1].predict(x)
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
        for net in nets:
            net.layers[1].weights.value[...] *= -1.5
            net.weights_changed()
    nets[0].unshare_outputs()
    assert not any(getattr(layer, path) for layer in nets[0].layers)
    return nets


def same_random_parameters(nets, seed: int) -> np.random.Generator:
    """Give every network of `nets` (one cfg) the same random parameters and BN statistics (rolling
    variances in [0.5, 1.5]); the generator, for the input."""
    rng = np.random.default_rng(seed)
    for layers in zip(*(net.layers for net in nets)):
        for params in zip(*(layer.params for layer in layers)):
            value = rng.standard_normal(params[0].value.shape) * 0.3
            for p in params:
                p.value[...] = value
        if getattr(layers[0], "bn", None) is not None:
            mean, var = rng.standard_normal(layers[0].n) * 0.1, rng.random(layers[0].n) + 0.5
            for layer in layers:
                layer.bn.rolling_mean[...], layer.bn.rolling_variance[...] = mean, var
    return rng
