"""The CPU darkpy's kernels run on, for the few choices between paths that measured opposite ways on
different CPUs.

Most rules that pick a convolution's path (direct, Winograd, GEMM) held on every machine they were
measured on. One did not, measured on two 2-core AVX-512 VMs, 2 threads:

- a 2-core Intel Xeon (family 6, model 167), OpenBLAS's SkylakeX kernels at 300-375 GFLOP/s;
- a 2-core AMD EPYC (family 26, model 2: Zen 5, LLVM's `znver5`), the same kernels at 490-540.

On Zen 5, darkpy's own register-blocked Winograd microkernel outran OpenBLAS's GEMMs at every batch
(`layers/conv_winograd.py`, FUSED_WIDE_ANY_BATCH_ON), and on layers up to 384 -> 256 channels
(FUSED_WIDER_MAX_WEIGHTS); on the Xeon the GEMMs won at large batches and on 384 -> 256.
(A second rule, deep layers at batch 1 on the direct kernel across filters, lost on Zen 5 only
while that kernel's microkernels spilled an accumulator at every tap; it now holds there too:
`kernels/direct_fv.py`, DEEP.) Each such rule names the CPUs it was measured on; a CPU not named
keeps the rule as first measured. `NUMBA_CPU_NAME`, numba's setting for the CPU it compiles for,
names the CPU when it is set to one.
"""
from __future__ import annotations

from llvmlite.binding import get_host_cpu_name
from numba import config


def _cpu_name(setting: str | None) -> str:
    """LLVM's name of the CPU (e.g. 'znver5', 'sapphirerapids'): the setting unless it is unset
    or 'host', else the host's."""
    return setting if setting and setting != "host" else get_host_cpu_name()


#: LLVM's name of the CPU the kernels run on.
HOST_CPU = _cpu_name(config.CPU_NAME)
