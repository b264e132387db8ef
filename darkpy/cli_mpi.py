"""`darkpy train` on several processes: `--procs N` (start the ranks) and what a rank's CLI does.

`darkpy train CFG --procs N` runs `mpiexec -n N python -m mpi4py -m darkpy train CFG ...` with the
same options (darkpy/distributed.py `launch`). Under mpiexec, each rank's `train` command runs in
`rank_context`: rank 0 prints progress, warnings and the result; the other ranks print only errors,
and an error on any rank ends the whole job (`abort_job_on_error`).
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Iterator

import click


def launch_ranks(ctx: click.Context, procs: int) -> int:
    """`--procs N`: run this command on N ranks of this host; returns the job's exit status."""
    from .distributed import launch, launcher_size

    if launcher_size() is not None:
        raise click.UsageError("--procs starts mpiexec itself; under mpiexec, leave it out "
                               "(mpiexec -n N darkpy train CFG ...)")
    return launch(rank_argv(ctx), procs)


def rank_argv(ctx: click.Context) -> list[str]:
    """The arguments each rank gets: the command as given (its parsed values), without --procs."""
    args = ["--debug"] if ctx.obj and ctx.obj.get("debug") else []
    args.append(ctx.info_name or ctx.command.name)
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if param.name == "procs" or value is None:
            continue
        if isinstance(param, click.Argument):
            args.append(str(value))
        elif getattr(param, "is_flag", False):
            if value:
                args.append(param.opts[0])
        else:
            args += [param.opts[0], str(value)]
    return args


@contextmanager
def rank_context(ctx: click.Context) -> Iterator[object]:
    """The job's communicator; under MPI with several ranks, warnings only on rank 0 and an error
    on any rank ends the job with that rank's one-line message."""
    from .distributed import abort_job_on_error, world

    comm = world()
    debug = bool(ctx.obj and ctx.obj.get("debug"))
    with warnings.catch_warnings():
        if comm.rank != 0:
            warnings.simplefilter("ignore")
        with abort_job_on_error(comm, debug):
            yield comm


def end_of_job(comm) -> None:
    """Ranks other than 0 wait, asleep, for rank 0 to finish its own work (the final validation,
    printing): MPI's finalize at exit would otherwise poll a core while rank 0 still computes."""
    from .distributed import abort_job_on_error

    with abort_job_on_error(comm):
        comm.barrier()
