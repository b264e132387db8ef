"""A small ONNX graph builder: nodes, initializers and constants, with unique names.

Every float constant is stored in the graph's compute dtype (float32, or float16 with `--fp16`), so
converters never think about it. Integer constants (shapes, axes, indices) are int64.
"""
from __future__ import annotations

import hashlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: The lowest opset darkpy's graphs need: Softmax over one axis, ReduceSum/Unsqueeze/Squeeze/Split
#: axes as inputs, Pad/Clip bounds as inputs (all opset 13). Every op used keeps its opset-13
#: signature up to the newest opset ONNX Runtime runs, so `--opset` may pick any of them.
MIN_OPSET = 13

_ONNX_DTYPE = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16}


class Graph:
    """Collects the nodes of one model. `dtype` is the compute dtype of every float tensor."""

    def __init__(self, dtype=np.float32):
        self.dtype = np.dtype(dtype)
        self.elem_type = _ONNX_DTYPE[self.dtype]
        self.nodes: list = []
        self.initializers: list = []
        self.inputs: list = []
        self.outputs: list = []
        self._names: dict[str, int] = {}
        self._consts: dict = {}

    def name(self, base: str) -> str:
        n = self._names.get(base, 0)
        self._names[base] = n + 1
        return base if n == 0 else f"{base}_{n}"

    # -- constants ---------------------------------------------------------------------------------
    def weight(self, arr, base: str, share: bool = False) -> str:
        """A float initializer (a layer's parameters), cast to the compute dtype. With `share`
        (small constants), an equal array asked for again is the same initializer."""
        a = np.ascontiguousarray(np.asarray(arr).astype(self.dtype, copy=False))
        key = ("w", a.shape, hashlib.sha1(a.tobytes()).digest()) if share else None
        if key is None or key not in self._consts:
            name = self.name(base)
            self.initializers.append(numpy_helper.from_array(a, name))
            if key is None:
                return name
            self._consts[key] = name
        return self._consts[key]

    def cached(self, key, make):
        """make() once per key (a layer's initializers, reused by every step of a recurrent layer)."""
        if key not in self._consts:
            self._consts[key] = make()
        return self._consts[key]

    def const(self, value, base: str = "c") -> str:
        """A small float constant (scalar or array), shared when the same value is asked twice."""
        return self.weight(np.asarray(value, np.float64), base, share=True)

    def ints(self, values, base: str = "i") -> str:
        """An int64 constant (shapes, axes, starts/ends, indices)."""
        a = np.asarray(values, np.int64)
        key = ("i", a.shape, a.tobytes())
        if key not in self._consts:
            name = self.name(base)
            self.initializers.append(numpy_helper.from_array(a, name))
            self._consts[key] = name
        return self._consts[key]

    def bools(self, values, base: str = "b") -> str:
        a = np.asarray(values, np.bool_)
        name = self.name(base)
        self.initializers.append(numpy_helper.from_array(a, name))
        return name

    # -- nodes -------------------------------------------------------------------------------------
    def op(self, op_type: str, inputs, base: str | None = None, outputs: int = 1, **attrs):
        """Add a node; returns its output name (or a list of `outputs` names)."""
        base = base or op_type.lower()
        names = [self.name(base) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, name=self.name("n_" + base), **attrs))
        return names[0] if outputs == 1 else names

    # shortcuts for the ops converters use most
    def reshape(self, x: str, shape, base: str = "reshape") -> str:
        return self.op("Reshape", [x, self.ints(list(shape))], base)

    def slice(self, x: str, starts, ends, axes, steps=None, base: str = "slice") -> str:
        ins = [x, self.ints(starts), self.ints(ends), self.ints(axes)]
        if steps is not None:
            ins.append(self.ints(steps))
        return self.op("Slice", ins, base)

    def mul(self, a: str, b: str, base: str = "mul") -> str:
        return self.op("Mul", [a, b], base)

    def add(self, a: str, b: str, base: str = "add") -> str:
        return self.op("Add", [a, b], base)

    def scale(self, x: str, k: float, base: str = "scale") -> str:
        return x if k == 1 else self.mul(x, self.const(k), base)

    # -- the model -----------------------------------------------------------------------------------
    def add_input(self, name: str, shape, elem_type=None) -> None:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type or TensorProto.FLOAT, list(shape)))

    def add_output(self, name: str, shape, elem_type=None) -> None:
        self.outputs.append(helper.make_tensor_value_info(name, elem_type or TensorProto.FLOAT, list(shape)))

    def model(self, opset: int, doc: str = "") -> onnx.ModelProto:
        g = helper.make_graph(self.nodes, "darkpy", self.inputs, self.outputs, self.initializers, doc_string=doc)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="darkpy")
        # the lowest IR version that this opset needs, so older runtimes load the file too
        m.ir_version = min(onnx.IR_VERSION, _ir_for_opset(opset))
        return m


def _ir_for_opset(opset: int) -> int:
    best = onnx.IR_VERSION
    for row in onnx.helper.VERSION_TABLE:       # (release, IR version, ai.onnx opset, ...)
        ir, ops = row[1], row[2]
        if ops >= opset:
            best = min(best, ir)
    return best
