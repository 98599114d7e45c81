"""The process group as the training run's components use it: a barrier, host numbers reduced over
ranks, rank 0 doing a job for all, and leaving the group. Plain ``torch.distributed``; joining the
group goes through DeepSpeed (:func:`cll_scale.training.engine.init_distributed`), which calls
:func:`open_host_group` here.
"""
from __future__ import annotations

import os
import socket
import sys

import torch

from cll_scale.core.errors import on_failure
from cll_scale.core.outputs import OutputError


_HOST_GROUP = None     # a gloo group for host numbers when the training group is NCCL
_OWN_WORLD_KEYS: tuple[str, ...] = ()   # the rendezvous variables set by one_process_world


def open_host_group() -> None:
    """The gloo group :func:`host_all_reduce` uses when the training group is not gloo (NCCL):
    host numbers then never wait for the GPU's queue. Every rank calls it, in the same order."""
    global _HOST_GROUP
    if _HOST_GROUP is None and torch.distributed.get_backend() != "gloo":
        _HOST_GROUP = torch.distributed.new_group(backend="gloo")


def free_port() -> int:
    """A TCP port free on this host now (the rendezvous of a one-process world, a local server)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_process_world() -> None:
    """Describe a one-process world in the environment, for a start without a launcher (which
    DeepSpeed would otherwise meet with MPI discovery). The variables are taken away again when
    the group is left: a process that trains in-process and later starts other processes (a
    test, a notebook, a sweep) must not hand them its rank and its rendezvous port."""
    global _OWN_WORLD_KEYS
    own = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    if "MASTER_PORT" not in os.environ:
        own["MASTER_PORT"] = str(free_port())
    os.environ.update(own)
    _OWN_WORLD_KEYS = tuple(own)


def _destroy() -> None:
    """Destroy every process group, through DeepSpeed's own call when DeepSpeed set the groups up:
    it also drops the groups it cached (its clone of the world group), which a later start in the
    same process (a test, a notebook) would otherwise use after they were destroyed ("Group ... is
    not registered"). Looked up, not imported: this module stays free of DeepSpeed."""
    ds_comm = sys.modules.get("deepspeed.comm")
    if ds_comm is not None and ds_comm.is_initialized():
        ds_comm.destroy_process_group()
    else:
        torch.distributed.destroy_process_group()
    _forget_own_world()


def _forget_own_world() -> None:
    global _OWN_WORLD_KEYS
    for key in _OWN_WORLD_KEYS:
        os.environ.pop(key, None)
    _OWN_WORLD_KEYS = ()


def shutdown() -> None:
    """Leave the process group once a command's work is done, all ranks together. Without it
    gloo's worker threads outlive the interpreter and a finished 2-rank CPU run could still abort
    at exit ("terminate called without an active exception"); destroying the group while the
    other rank was still communicating did too (1 test in 10). Call it on success only: after a
    failure the barrier would wait for ranks that are gone."""
    global _HOST_GROUP
    if torch.distributed.is_initialized():
        torch.distributed.barrier()      # no rank tears its connections down while another still talks
        _destroy()
    _HOST_GROUP = None


def abandon() -> None:
    """Leave the process group after a failure, when this process is the whole world. A refusal
    raised after ``init_distributed`` (an output of other settings, say) would otherwise exit
    with gloo's threads alive, and the interpreter could abort at exit ("terminate called
    without an active exception", exit -6) instead of returning the refusal's exit code. With
    other ranks there is nobody to wait for at a barrier: the launcher ends them."""
    global _HOST_GROUP
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() == 1:
        _destroy()
        _HOST_GROUP = None


# The error path (core.errors, a layer below) calls this on every expected failure of a command
# that loaded the collectives: registered here, so that it needs no reach up to this module.
on_failure(abandon)


def all_gather_object(obj) -> list:
    out = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, obj)
    return out


def host_all_reduce(values: list[float], op: str = "sum") -> list[float]:
    """Reduce a few host numbers over ranks through a gloo group on CPU tensors: the training
    loop's per-step agreement (stop signal, budget) never waits for the GPU's queue to drain."""
    t = torch.tensor(values, dtype=torch.float64)
    ops = {"sum": torch.distributed.ReduceOp.SUM, "max": torch.distributed.ReduceOp.MAX,
           "min": torch.distributed.ReduceOp.MIN}
    torch.distributed.all_reduce(t, op=ops[op], group=_HOST_GROUP)
    return t.tolist()


def on_rank0(fn, what: str):
    """Run ``fn`` on rank 0 only and return its result there; an expected error it raises
    (``OSError``, ``ValueError``) is raised on every rank, since the others would otherwise wait
    for rank 0 in their next collective."""
    result, error = None, None
    if torch.distributed.get_rank() == 0:
        try:
            result = fn()
        except (OSError, ValueError) as err:
            error = err
    if host_all_reduce([float(error is not None)])[0]:
        raise error or OutputError(f"{what}: refused on rank 0 (see its message)")
    return result


def ranks_agree(flag: bool) -> bool:
    """True on every rank when ``flag`` is true on every rank (engine settings must be the same
    on all of them)."""
    return host_all_reduce([float(flag)], "min")[0] > 0


def barrier() -> None:
    torch.distributed.barrier()
