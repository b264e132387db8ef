"""YOLO9000's softmax tree: the `.tree` hierarchy file, `tree=` in `[softmax]` and in `[region]`.

The `.tree` file (Darknet's `read_tree`): one node per line, `name parent` (whitespace-separated;
parent is the index of an earlier line, −1 for a root; a line without a parent reads −1). Node i
is output i. Consecutive lines with the same parent form one GROUP: the softmax runs over each
group separately. A node is a leaf unless some node names it as parent. Darknet's `read_tree`
opens the file relative to the current directory (and crashes if it is missing); darkpy looks
there first, then beside the cfg's folder and in it (`cfg/x.cfg` + `data/9k.tree`), and a missing
or malformed file is a CfgError naming the section, the key and the line.

`[softmax]` with `tree=` (AlexeyAB's `forward_softmax_layer`): the input (one value per tree node)
gets a softmax over each group, in file order; `temperature` applies. With truth, Darknet's
classifier first fills the hierarchy (`fill_hierarchy`: every ancestor of a positive label is
positive too; a group without any positive is marked "don't care") and its GPU path masks the loss
and delta of don't-care groups; darkpy does both inside the layer, so the truth is the plain
one-hot (or multi-hot) vector over the tree's nodes. (Darknet's CPU path does not mask: the
don't-care marker −1234 then enters its cross-entropy as a truth value.)

`[region]` with `tree=` (YOLO9000): the class planes of each anchor get the group-wise softmax
instead of one softmax; the class delta of an anchor that a truth trains is Darknet's
`delta_region_class` with a hierarchy: for the truth's class and each of its ancestors, every
member of that node's group gets `class_scale·(0 − p)` and the node `class_scale·(1 − p)`; other
groups get none. Not implemented: Darknet's "classification-only" truths (x, y > 100000, from the
ImageNet half of YOLO9000's joint training); such a row is an invalid box here.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np
from numba import prange

from ..kernels import pjit
from .base import State
from .region import RegionLayer
from .softmax import SoftmaxLayer, truth_rows


@dataclass
class Tree:
    """A parsed `.tree` file (see the module docstring)."""

    names: list[str]
    parent: np.ndarray          # (n,) int64, −1 for a root
    group: np.ndarray           # (n,) int64, the group of each node
    group_offset: np.ndarray    # (groups,) int64, first node of each group
    group_size: np.ndarray      # (groups,) int64
    leaf: np.ndarray            # (n,) bool
    file: str = ""

    @property
    def n(self) -> int:
        return len(self.names)

    @property
    def groups(self) -> int:
        return len(self.group_size)

    def ancestors(self, node: int) -> list[int]:
        """node, its parent, ..., the root."""
        out = []
        while node >= 0:
            out.append(node)
            node = int(self.parent[node])
        return out


class TreeError(ValueError):
    """A malformed .tree file (message names the line)."""


def parse_tree(text: str, file: str = "<tree>") -> Tree:
    names: list[str] = []
    parents: list[int] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        parts = line.split()
        if not parts:
            raise TreeError(f"{file}:{lineno}: empty line (expected 'name parent')")
        try:
            parent = int(parts[1]) if len(parts) > 1 else -1
        except ValueError:
            raise TreeError(f"{file}:{lineno}: parent {parts[1]!r} is not an integer") from None
        if not -1 <= parent < len(names):
            raise TreeError(f"{file}:{lineno}: parent {parent} must be -1 or an earlier line's index "
                            f"(0..{len(names) - 1})")
        names.append(parts[0])
        parents.append(parent)
    if not names:
        raise TreeError(f"{file}: the tree file is empty")
    parent = np.asarray(parents, np.int64)
    group = np.zeros(len(names), np.int64)
    offsets, sizes = [0], [0]
    for i in range(len(names)):
        if i and parent[i] != parent[i - 1]:       # a new run of siblings
            offsets.append(i)
            sizes.append(0)
        sizes[-1] += 1
        group[i] = len(sizes) - 1
    leaf = np.ones(len(names), bool)
    leaf[parent[parent >= 0]] = False
    return Tree(names, parent, group, np.asarray(offsets, np.int64), np.asarray(sizes, np.int64), leaf, file)


def find_data_file(value: str, cfg_file: str) -> str | None:
    """An existing path for a data file named in a cfg: as given (Darknet: relative to the current
    directory), else relative to the cfg's parent folder, else to the cfg's folder."""
    if os.path.exists(value):
        return value
    if os.path.isabs(value):
        return None
    folder = os.path.dirname(os.path.abspath(cfg_file)) if cfg_file and not cfg_file.startswith("<") else ""
    for base in (os.path.dirname(folder), folder) if folder else ():
        alt = os.path.join(base, value)
        if os.path.exists(alt):
            return alt
    return None


def load_tree(sec, key: str = "tree") -> Tree:
    value = sec.get_str(key)
    path = find_data_file(value, sec.file)
    if path is None:
        raise sec.error(f"no such tree file {value!r} (looked in the current directory and beside the "
                        f"cfg's folder)", key)
    try:
        with open(path, encoding="utf-8") as f:
            return parse_tree(f.read(), path)
    except TreeError as e:
        raise sec.error(f"bad tree file: {e}", key) from None
    except (OSError, UnicodeDecodeError) as e:
        raise sec.error(f"cannot read the tree file {path!r} ({e})", key) from None


# -- kernels -------------------------------------------------------------------------------------
@pjit
def tree_softmax(out, x, offsets, sizes, temp):
    """out, x: (R, n, S). For every row r and position s, softmax of x[r, :, s] / temp over each
    group [offsets[g], offsets[g] + sizes[g])."""
    R, _, S = x.shape
    for rs in prange(R * S):
        r = rs // S
        s = rs % S
        for g in range(offsets.size):
            lo = offsets[g]
            hi = lo + sizes[g]
            largest = -np.inf
            for i in range(lo, hi):
                if x[r, i, s] > largest:
                    largest = x[r, i, s]
            total = 0.0
            for i in range(lo, hi):
                e = math.exp((x[r, i, s] - largest) / temp)
                out[r, i, s] = e
                total += e
            for i in range(lo, hi):
                out[r, i, s] /= total


def fill_hierarchy(tree: Tree, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Darknet's fill_hierarchy for truth rows t (B, n): (filled truth, care mask). Every ancestor
    of a positive node becomes 1; a group with no positive is masked out (care = 0)."""
    filled = (t > 0).astype(t.dtype)
    for b in range(t.shape[0]):
        for node in np.flatnonzero(filled[b]):
            p = int(tree.parent[node])
            while p >= 0:
                filled[b, p] = 1
                p = int(tree.parent[p])
    positive = np.add.reduceat(filled, tree.group_offset, axis=1) > 0       # (B, groups)
    care = positive[:, tree.group].astype(t.dtype)
    return np.where(t > 0, t, filled).astype(t.dtype), care


# -- layers --------------------------------------------------------------------------------------
class TreeSoftmaxLayer(SoftmaxLayer):
    """`[softmax]` with `tree=`: a softmax over each group of the hierarchy."""

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> "TreeSoftmaxLayer":
        tree = load_tree(sec)
        layer = super().from_cfg(sec, in_shape, ctx)
        if layer.groups != 1:
            raise sec.error("groups and tree cannot be combined (the tree defines the groups)", "groups")
        if layer.outputs != tree.n:
            raise sec.error(f"the tree {tree.file!r} has {tree.n} nodes; the layer has {layer.outputs} "
                            f"inputs (one per node)", "tree")
        layer.tree = tree
        return layer

    def forward(self, s: State) -> None:
        x = s.input.reshape(self.batch, self.outputs, 1)
        tree_softmax(self.output.reshape(x.shape), x, self.tree.group_offset, self.tree.group_size,
                     self.temperature)
        if s.truth is None:
            return
        self.allocate_training()
        if self.noloss:
            self.loss.fill(0)
            self.cost = 0.0
            return
        t, care = fill_hierarchy(self.tree, truth_rows(s, self))
        p = self.output
        np.subtract(t, p, out=self.delta)
        self.delta *= care
        logp = np.log(np.maximum(p, np.finfo(self.dtype).tiny))
        np.multiply(-logp, (t != 0) * care, out=self.loss)
        self.cost = float(self.loss.sum(dtype=np.float64))

    def summary(self) -> str:
        return f"softmax tree ({self.tree.groups} groups)                {self.inputs:4d}"


class TreeRegionLayer(RegionLayer):
    """`[region]` with `tree=` (YOLO9000): group-wise class softmax and hierarchical class deltas."""

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> "TreeRegionLayer":
        tree = load_tree(sec)
        layer = super().from_cfg(sec, in_shape, ctx)
        if layer.classes != tree.n:
            raise sec.error(f"the tree {tree.file!r} has {tree.n} nodes; classes={layer.classes} "
                            f"(one per node)", "tree")
        layer.tree = tree
        layer.softmax = True           # darknet: the tree replaces the softmax/logistic choice
        return layer

    def forward(self, s: State) -> None:
        super().forward(s)            # activations (flat softmax on the classes) and flat deltas
        _, h, w = self.out_shape
        x = s.input.reshape(self.batch, self.n, self.entries, h * w)[:, :, 5:]
        out4 = self.output.reshape(self.batch, self.n, self.entries, h * w)
        planes = np.empty((self.batch * self.n, self.classes, h * w), self.dtype)
        tree_softmax(planes, np.ascontiguousarray(x).reshape(planes.shape), self.tree.group_offset,
                     self.tree.group_size, 1.0)
        out4[:, :, 5:] = planes.reshape(self.batch, self.n, self.classes, h * w)
        if s.truth is None:
            return
        self._hierarchical_class_deltas()
        np.square(self.delta, out=self.loss)
        self.cost = float(self.loss.sum())

    def _hierarchical_class_deltas(self) -> None:
        """Replace the flat class deltas of every trained anchor (those with any class delta: the
        flat rule gives only its truth class a positive delta) by delta_region_class's."""
        _, h, w = self.out_shape
        d = self.delta.reshape(self.batch, self.n, self.entries, h * w)[:, :, 5:]
        p = self.output.reshape(self.batch, self.n, self.entries, h * w)[:, :, 5:]
        trained = np.argwhere(np.any(d != 0, axis=2))          # (k, 3): b, anchor, cell
        tree, scale = self.tree, self.class_scale
        for b, a, cell in trained:
            col = d[b, a, :, cell]
            cls = int(np.argmax(col))
            col[...] = 0
            pc = p[b, a, :, cell]
            for node in tree.ancestors(cls):
                lo = tree.group_offset[tree.group[node]]
                hi = lo + tree.group_size[tree.group[node]]
                col[lo:hi] = scale * (0 - pc[lo:hi])
                col[node] = scale * (1 - pc[node])

    def summary(self) -> str:
        return "detection (tree)"
