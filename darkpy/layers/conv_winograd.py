"""The Winograd path of `[convolutional]` layers: how a batch is cut into chunks of items, the
transforms (kernels/winograd.py) and the 16 GEMMs between them, and the weight gradient.

`ConvolutionalLayer` (layers/convolutional.py) chooses the path (`_use_winograd`) and inherits
`WinogradConv`'s methods. The transformed filters U (16 matrices n x c) sit at the start of the
shared workspace (kernels/im2col.py), the transformed input V (16 matrices c x tiles) and product M
(16 matrices n x tiles) of a chunk after them, each set of 16 XI_PAD values apart (`_xi_rows`).
Each transform is one kernel over the chunk, the 16 GEMMs one `blas.matmul` call (as concurrent
streams, one per thread). Correlations over few channels, and wider ones in small batches, skip
the chunks: one fused kernel does the three steps band by band (`FUSED_BANDS`,
kernels/winograd_fused.py); over few channels the weight gradient too (`FUSED_WGRAD`).
"""
from __future__ import annotations

import numpy as np

from .. import blas
from ..kernels import im2col as ic
from ..kernels import cpu, simd, thread_count
from ..kernels import winograd as wg
from ..kernels import winograd_fused as wf
from ..kernels.pool2x2 import no_pool

#: Batch items per Winograd chunk: as many as keep V and M (the transformed input and product) within
#: WINOGRAD_CHUNK_VALUES (32 MiB in float32, as im2col's CHUNK_VALUES), so that the 16 GEMMs
#: read V while it is still in a cache level (shapes-tiny training 0.93x time at 1<<20 against the whole
#: batch at once, on a 2-core Zen 4), but at least WINOGRAD_MIN_GEMM_TILES tiles, so the GEMMs stay
#: wide enough for BLAS (cifar at b64 was 1.15x slower with one 196-tile item per chunk). Each chunk
#: starts two parallel regions, and where waking the workers is dear (66 µs on a 2-core Zen 5 VM)
#: fewer chunks win: there 1<<22 against 1<<20 took 0.76-0.85x the time of a shapes-tiny b64
#: forward, 0.76-0.85x of its b32 training step, 0.94-1.09x of cifar b64 and 0.92-0.98x of
#: yolov3-tiny b16 (two rounds each, 2 threads, OpenBLAS's Haswell kernels as that machine's shell
#: pinned them); 1<<24 was no better than 1<<22. On a 2-core Xeon (AVX-512, OpenBLAS's SkylakeX
#: kernels), alternating in one process, 1<<23 against 1<<22: the training steps of shapes-tiny at
#: b32 0.97-0.98x the time, cifar at b128 0.96-0.98x, digits at b32 0.97x; inference of shapes-tiny
#: and yolov3-tiny at b64 level (1<<24 counts as 1<<23: `_winograd_chunk` caps it there).
WINOGRAD_CHUNK_VALUES = 1 << 23
WINOGRAD_MIN_GEMM_TILES = 256
#: ... and in a network that only infers (`Network.share_outputs`), half as many: cifar at b64 took
#: the same time (1.005x, alternating in one process, 2 threads, 2-core AVX-512 Xeon) and its peak
#: RSS fell 380 -> 364 MB (PyTorch's: 353).
WINOGRAD_INFER_CHUNK_VALUES = 1 << 22
#: A training forward keeps the Winograd transform of its input, V (16 values per 2x2 tile and
#: channel, about 4x the input), for the weight gradient, which otherwise transforms the same input
#: again, when the whole batch's V has at most this many values (8 MiB in float32): the small
#: layers and batches of digits and shapes-tiny. Larger ones transform again rather than hold it:
#: the transform reads the input once, against the 16 GEMMs' n-fold reuse of V, while holding V
#: at the former 32 MiB cap cost darknet19's training at b16 110 MB (eight layers).
WINOGRAD_KEEP_VALUES = 1 << 21
#: Padding (values) between the 16 matrices of a Winograd buffer: with it the 16 streams a transform
#: reads or writes are not a power of two apart, which made them collide in the cache (measured 3x).
XI_PAD = 16
#: At most this many values (32 MiB in float32) of kept filter transforms per network
#: (`plan_kept_filters`): the inference peak memory stays below PyTorch's on every suite network.
KEPT_FILTER_VALUES = 1 << 23
#: Layers on Winograd at the batch anyway keep their filter transform too, in the room the others
#: leave (`plan_kept_filters`); False: only those the kept transform moves onto Winograd. At batch
#: 1 a 128 -> 128 layer on 28x28 made its transform at every forward, a third of the layer's time.
#: Alternating in one process (2 threads, 2-core Xeon, AVX-512), the whole forward at batch 1:
#: cifar 0.95x the time, darknet.cfg 0.97x, yolov3-tiny 0.96x, darknet19 level.
KEEP_ANYWAY = True
#: Fused bands (kernels/winograd_fused.py: each band of tile rows transformed, multiplied by the
#: register-blocked microkernel and finished in one task, V in L2) for the forward and the input
#: gradient of two kinds of correlation (`_fused`):
#: - over at most FUSED_MAX_CHANNELS input channels with at least FUSED_MIN_TILES tiles per item,
#:   at any batch: the 16 GEMMs' shared dimension (K = c) is short, where OpenBLAS runs far below
#:   its rate, and V and M dominate the traffic. Alternating in one process (2 threads, 2-core
#:   AVX-512 Xeon): shapes-tiny's training step at b32 0.93-0.94x the time (its 96 -> 64 layer on
#:   16x16 0.75x forward), its b64 inference 0.84-0.87x, yolov4-tiny b64 0.93-0.95x, digits'
#:   training step 0.97x; tiny.cfg, darknet.cfg, darknet19, yolov3-tiny, resnet50 at b64 level.
#: - with a filter transform of at most FUSED_WIDE_MAX_WEIGHTS values per ξ (n·c: 256 -> 256) in
#:   batches of at most FUSED_WIDE_MAX_TILES tiles: there the chunked path's GEMMs are as narrow as
#:   the batch (N = 49-196 at batch 1: OpenBLAS at 120-185 GFLOP/s on 2 threads), the microkernel
#:   is not. Against the chunked path (same machine, whole forward or step): batch 1 cifar 0.86x
#:   the time, tiny.cfg 0.88x, darknet.cfg 0.9x, yolov3-tiny 0.96x, resnet50 0.97x, darknet19 and
#:   yolov4-tiny level; 1024 tiles against 256: shapes-tiny b64 0.95x, its training 0.98x, digits'
#:   training 0.96x, darknet.cfg and yolov4-tiny b1 0.96-0.97x. Every band reads all of U, so wider
#:   layers stay chunked (yolov3-tiny's 384 -> 256 on 26x26 at batch 1: 1.42x; a limit of 512 ->
#:   512 lost 5 % on yolov3-tiny), and so do larger batches of wide layers, whose GEMMs are wide
#:   (cifar's 128 -> 256 on 14x14 at b64: 1.06-1.13x).
FUSED_BANDS = True
FUSED_MAX_CHANNELS = 96
FUSED_MIN_TILES = 64
FUSED_WIDE_MAX_WEIGHTS = 256 * 256
FUSED_WIDE_MAX_TILES = 1024
#: ... but at any batch on the CPUs (kernels/cpu.py) where the microkernel outran the chunked
#: path's wide GEMMs too. On a 2-core Zen 5 EPYC (OpenBLAS's GEMMs at ~500 GFLOP/s), processes
#: alternating with the limit (2 threads, medians of 5-20 passes): batch 64 inference of cifar
#: 0.81-0.87x the time (its 128 -> 128 on 28x28 40 -> 28 ms, 256 -> 256 on 14x14 28 -> 24 ms),
#: resnet50 and yolov4-tiny 0.88x, darknet19 and tiny.cfg 0.90-0.91x, yolov3-tiny 0.97x,
#: shapes-tiny level, darknet.cfg 1.03x (one run); training steps of cifar at b128 0.87x,
#: darknet19 at b16 0.92x, digits at b32 0.98x. A wider limit (512 -> 512, cifar at b64) was level.
FUSED_WIDE_ANY_BATCH_ON = frozenset({"znver5"})
#: ... and there up to FUSED_WIDER_MAX_WEIGHTS values per ξ (384 -> 256), which lost on the Xeon.
#: Zen 5, each side's network made anew in one process (`benchmarks.step_time --ab-setting`, 2
#: threads): yolov3-tiny b1 0.979x the time (its 384 -> 256 on 26x26 2.82-2.91 -> 2.26-2.34 ms
#: within the forward; ONNX Runtime's node 2.41), yolov4-tiny b1 0.969x; at b64 0.992x and 0.980x.
#: Those two are the suite's only layers it moves.
FUSED_WIDER_MAX_WEIGHTS = 384 * 256
if cpu.HOST_CPU in FUSED_WIDE_ANY_BATCH_ON:
    FUSED_WIDE_MAX_TILES = None
    FUSED_WIDE_MAX_WEIGHTS = FUSED_WIDER_MAX_WEIGHTS
#: The training forward that keeps V for the weight gradient takes the fused bands too, each band
#: writing its V straight into the kept buffer (in the chunked layout; the products read it from
#: there). Alternating in one process (2 threads, 2-core AVX-512 Xeon): shapes-tiny's training
#: step at b32 0.96-0.99x the time, digits' level. False: that forward stays chunked.
FUSED_KEEP = True
#: The weight gradient of correlations over at most FUSED_WGRAD_MAX_CHANNELS input channels (and at
#: least a quarter of FUSED_MIN_TILES tiles per item) in bands too (`wf.weight_grad3x3`): per band
#: V (kept, or made) and dMᵀ in L2, the products summed into WGRAD_SLICES partial sums (a fixed
#: number, so the bits do not depend on the thread count), instead of the 16 GEMMs dM Vᵀ over
#: the whole chunk (K = its tiles, M x N = n x c: OpenBLAS at ~128 GFLOP/s on 2 threads for
#: shapes-tiny's 96 -> 64 layer). Same machine, alternating: shapes-tiny's training step at b32
#: 0.94-0.95x the time, digits' 0.97-0.98x. False: the chunked GEMMs.
FUSED_WGRAD = True
#: ... over up to FUSED_WGRAD_MAX_CHANNELS input channels, not the forward's FUSED_MAX_CHANNELS:
#: cifar's training step at b128, whose layers of 128 and 256 channels had taken the chunked GEMMs
#: (their weight gradients 1.6-2.1x their forwards), with 256 against 96 alternating in one
#: process (2 threads, 2-core Zen 5, 3 rounds): 0.936x the time (the 128 -> 128 layers on 28x28
#: 98 -> 47-51 ms each, 256 -> 256 on 14x14 63 -> 41 ms, 128 -> 256 36 -> 22 ms, 256 -> 512 on
#: 7x7 38 -> 32 ms); darknet19's at b16 0.976x; peak RSS level (the shared workspace held the
#: partial sums already). 512 channels measured level (cifar's 512 -> 512 on 7x7: 64 -> 65 ms)
#: and hold 4x the partial sums.
FUSED_WGRAD_MAX_CHANNELS = 256
WGRAD_SLICES = 4
_NONE = np.empty(0)


class WinogradConv:
    """The Winograd methods of `ConvolutionalLayer` (a mixin: it uses the layer's shapes, weights,
    batch norm and training buffers)."""

    def _winograd_allocate(self, batch: int) -> None:
        """Chunk size, workspace and the kept-V size for `batch`."""
        c, n = self.in_shape[0], self.n
        # tiles of the forward's output, or of backward's (the input's size): the larger
        th, tw = max(wg.tiles(*self.out_shape[1:]), wg.tiles(*self.in_shape[1:]))
        # per item: V (c x tiles) and M (n x tiles), 16 of each; backward swaps c and n
        self.wchunk = _winograd_chunk(16 * th * tw * (c + n), th * tw, batch, self.inference_only)
        tiles = self.wchunk * th * tw
        ic.reserve(max(_xi_size(n, c) + _xi_size(max(c, n), tiles) * 2,
                       WGRAD_SLICES * 16 * c * _lanes(n)), self.dtype)
        kept = sum(_xi_size(c, t) for _, t in self._chunk_tiles(self.out_shape[1:]))
        self._vkeep_values = kept if kept <= WINOGRAD_KEEP_VALUES else 0

    def _winograd(self, x: np.ndarray, w: np.ndarray, pad: int, y: np.ndarray, add: bool,
                  keep: bool = False, epilogue: tuple = (), u: np.ndarray | None = None,
                  pool: np.ndarray | None = None, mean: np.ndarray | None = None) -> None:
        """y (B, n', oh', ow') = (or +=) the 3x3 stride-1 correlation of x (B, c', h', w') with the
        filters w (n', c', 3, 3) and padding `pad`, by Winograd F(2x2, 3x3), `self.wchunk` items at
        a time. Forward: x the input, w the weights. Backward: x the delta, w the weights flipped
        and transposed, pad 2 − padding, y the previous delta. `keep`: the transformed input goes
        to `vkeep` (for the weight gradient) instead of the workspace. `epilogue`: (k, off, act)
        of `inference_epilogue`, applied to each output plane as it is written. `u`: w's filter
        transform when kept (`kept_filters`), else it is made into the workspace. `pool`, with an
        epilogue: the 2x2 maxima of each finished plane go there instead of y (`wg.outputs`);
        `mean` (B, n'), with an epilogue, on the chunked path: each finished plane's mean."""
        n, c = w.shape[:2]
        if u is None:
            u = _xi_view(0, n, c, self.dtype)
            wg.filters(u, w)
        th, tw = wg.tiles(*y.shape[2:])
        if (FUSED_BANDS and (FUSED_KEEP or not keep) and mean is None
                and _fused(c, n, th * tw, y.shape[0])):
            k, off, act = epilogue if epilogue else (_NONE, _NONE, 0)
            threads = thread_count()
            bands = wf.band_count(tw, th, c, n, y.shape[0], threads)
            wf.conv3x3(y, x, _flat(u), n * c + XI_PAD, pad, add, k, off, act,
                       no_pool(y.dtype) if pool is None else pool, bands,
                       wf.groups(n, y.shape[0] * bands, threads),
                       self.vkeep[:self._vkeep_values if keep else 0], self.wchunk)
            return
        for items, vrows, m in self._winograd_chunks(c, n, y.shape[2:], kept=keep):
            wg.inputs(vrows, x[items], pad)
            # the 16 GEMMs in one call (numpy loops over ξ)
            blas.matmul(u, _as_matrices(vrows, c, m.shape[2]), out=m)
            wg.outputs(y[items], m, add, *epilogue, pool=None if pool is None else pool[items],
                       mean=None if mean is None else mean[items])

    def winograd_in_bands(self, batch: int) -> bool:
        """Whether this layer's inference forward on Winograd at `batch` takes the fused bands
        (`_fused`), not the chunked path's 16 GEMMs."""
        th, tw = wg.tiles(*self.out_shape[1:])
        return FUSED_BANDS and _fused(self.in_shape[0], self.n, th * tw, batch)

    def kept_filters(self) -> np.ndarray:
        """The weights' filter transform U, made at the first call after `allocate` or
        `weights_changed` and kept (16 (n, c) matrices in a buffer of the layer's own)."""
        if self._kept_u is None:
            n, c = self.weights.value.shape[:2]
            u = _xi_view(0, n, c, self.dtype, np.empty(_xi_size(n, c), self.dtype))
            wg.filters(u, self.weights.value)
            self._kept_u = u
        return self._kept_u

    def weights_changed(self) -> None:
        """Drop what was computed from the weights (the kept filter transform)."""
        self._kept_u = None

    def _chunk_tiles(self, out_hw: tuple):
        """(item slice, tiles) of each Winograd chunk for an output of out_hw (h, w) per item."""
        th, tw = wg.tiles(*out_hw)
        for b0 in range(0, self.batch, self.wchunk):
            b1 = min(b0 + self.wchunk, self.batch)
            yield slice(b0, b1), (b1 - b0) * th * tw

    def _winograd_chunks(self, c: int, n: int, out_hw: tuple, kept: bool = False):
        """(item slice, V's rows (16, c·tiles + XI_PAD), M (16, n, tiles)) per chunk of `self.wchunk`
        items, views of the workspace after the 16 (n, c) matrices at its start (U or dU), for an
        output of out_hw (h, w) per item; V from `vkeep` instead with `kept` (chunk after chunk)."""
        off = _xi_size(n, c)
        at = 0
        for items, tiles in self._chunk_tiles(out_hw):
            if kept:
                v = _xi_rows(at, c, tiles, self.dtype, self.vkeep)
            else:
                v = _xi_rows(off, c, tiles, self.dtype)
            at += _xi_size(c, tiles)
            yield items, v, _xi_view(off + _xi_size(c, tiles), n, tiles, self.dtype)

    def _winograd_weight_grad(self, x: np.ndarray, dy: np.ndarray) -> None:
        """weights.grad += the gradient of the Winograd forward, exactly the convolution's: per
        chunk, dM = A dY Aᵀ per tile (dy (B, n, oh, ow)), the 16 GEMMs dU[ξ] = dM[ξ] @ V[ξ]ᵀ with V
        the input's transform (x (B, c, h, w); kept by the training forward when it fits
        WINOGRAD_KEEP_VALUES, else computed again), and Gᵀ dU G added into the gradient. Over few
        channels (FUSED_WGRAD) the same sums band by band instead (`wf.weight_grad3x3`)."""
        n, c = self.n, self.in_shape[0]
        th, tw = wg.tiles(*dy.shape[2:])
        if FUSED_WGRAD and c <= FUSED_WGRAD_MAX_CHANNELS and th * tw >= FUSED_MIN_TILES // 4:
            du = ic.get((WGRAD_SLICES, 16, c, _lanes(n)), self.dtype)
            bands = wf.band_count(tw, th, c, n, self.batch, WGRAD_SLICES)   # (not the threads)
            kept = self.vkeep[:self._vkeep_values if self._v_kept else 0]
            wf.weight_grad3x3(du, x, dy, self.padding, bands, kept, self.wchunk)
            for s in range(1, WGRAD_SLICES):
                np.add(du[0], du[s], out=du[0])
            wg.filters_adjoint_add(self.weights.grad, du[0, :, :, :n].transpose(0, 2, 1))
            return
        du = _xi_view(0, n, c, self.dtype)
        for items, vrows, dm in self._winograd_chunks(c, n, dy.shape[2:], kept=self._v_kept):
            if not self._v_kept:
                wg.inputs(vrows, x[items], self.padding)
            wg.outputs_adjoint(dm, dy[items])
            v = _as_matrices(vrows, c, dm.shape[2])
            blas.matmul(dm, v.transpose(0, 2, 1), out=du)
            wg.filters_adjoint_add(self.weights.grad, du)


def _flat(u: np.ndarray) -> np.ndarray:
    """The 16 (n, c) matrices of a `_xi_view` as the flat run of memory they lie in (matrix ξ at
    ξ·(n·c + XI_PAD)), for the fused kernel."""
    n, c = u.shape[1:]
    return np.lib.stride_tricks.as_strided(u, shape=(16 * (n * c + XI_PAD) - XI_PAD,),
                                           strides=(u.itemsize,))


def plan_kept_filters(layers, batch: int, fixed: bool) -> None:
    """Which layers keep their Winograd filter transform at `batch` (sets `keep_filters`; call before
    the layers' `allocate`, which chooses the path by it). Only while the weights are `fixed`
    (`Network.share_outputs`: inference only): first the layers that the kept transform moves onto
    Winograd (`kept_filters_gain`), most output tiles first, then, with KEEP_ANYWAY and in network
    order, those on Winograd anyway (`on_winograd_anyway`), while the kept transforms total at most
    KEPT_FILTER_VALUES values: a transform is 16/9 of its weights (yolov3-tiny's 13x13 layers would
    keep 50 MB at 416, beyond the 16 MB its 256 -> 512 ones take within the cap)."""
    wanted = []
    for layer in layers:
        if hasattr(layer, "keep_filters"):
            layer.keep_filters = False
            if not fixed:
                continue
            gain = layer.kept_filters_gain(batch)
            if gain:
                wanted.append((0, -gain, layer.index, layer))
            elif KEEP_ANYWAY and layer.on_winograd_anyway(batch):
                wanted.append((1, 0, layer.index, layer))
    room = KEPT_FILTER_VALUES
    for *_, layer in sorted(wanted, key=lambda t: t[:3]):
        size = _xi_size(*layer.weights.value.shape[:2])
        if size <= room:
            layer.keep_filters = True
            room -= size


def _lanes(n: int) -> int:
    """n rounded up to a whole number of SIMD vectors."""
    return -(-n // simd.LANES) * simd.LANES


def _fused(c: int, n: int, tiles: int, batch: int) -> bool:
    """Whether a c -> n correlation with `tiles` tiles per item takes the fused bands at `batch`
    (FUSED_MAX_CHANNELS, FUSED_WIDE_MAX_WEIGHTS, FUSED_WIDE_MAX_TILES: None for any batch)."""
    narrow = c <= FUSED_MAX_CHANNELS and tiles >= FUSED_MIN_TILES
    few = FUSED_WIDE_MAX_TILES is None or batch * tiles <= FUSED_WIDE_MAX_TILES
    return narrow or (n * c <= FUSED_WIDE_MAX_WEIGHTS and few)


def _winograd_chunk(per_item: int, tiles: int, batch: int, inference_only: bool = False) -> int:
    """Items per Winograd chunk for `per_item` values of V and M and `tiles` tiles per item (in a
    network that only infers, WINOGRAD_INFER_CHUNK_VALUES)."""
    fit = (WINOGRAD_INFER_CHUNK_VALUES if inference_only else WINOGRAD_CHUNK_VALUES) // per_item
    wide = -(-WINOGRAD_MIN_GEMM_TILES // tiles)
    return max(1, min(batch, max(fit, wide), ic.CHUNK_VALUES // per_item))


def _xi_size(a: int, b: int) -> int:
    """Workspace values of 16 (a, b) matrices XI_PAD apart (see `_xi_view`)."""
    return 16 * (a * b + XI_PAD)


def _xi_rows(offset: int, a: int, b: int, dtype, buf: np.ndarray | None = None) -> np.ndarray:
    """The 16 rows (16, a·b + XI_PAD), C-contiguous, of the shared workspace (or of the flat array
    `buf`) from `offset` that hold 16 (a, b) matrices XI_PAD apart; the form the transform kernels
    take (`wg.inputs`)."""
    n = _xi_size(a, b)
    return (ic.get((n,), dtype, offset) if buf is None else buf[offset:offset + n]).reshape(16, -1)


def _xi_view(offset: int, a: int, b: int, dtype, buf: np.ndarray | None = None) -> np.ndarray:
    """The same 16 matrices as a (16, a, b) view whose every [ξ] is a BLAS-ready matrix."""
    return _as_matrices(_xi_rows(offset, a, b, dtype, buf), a, b)


def _as_matrices(rows: np.ndarray, a: int, b: int) -> np.ndarray:
    """(16, a, b) matrices of the rows `_xi_rows` returned."""
    return rows[:, :a * b].reshape(16, a, b)
