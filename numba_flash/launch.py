"""One process per GPU without PyTorch: ``numba-flash launch`` (issue #15).

:func:`launch` starts ``nproc`` copies of a Python script, one per GPU of this host, and
hands each its place in the ring through the environment:

``NUMBA_FLASH_RANK``        this process's rank, 0 .. world − 1 (it uses GPU ``rank``)
``NUMBA_FLASH_WORLD_SIZE``  the number of processes
``NUMBA_FLASH_NCCL_ID``     the NCCL unique id, hex (made once, by the launcher)
``NCCL_NVLS_ENABLE=0``      NVLink multicast off, as the shared machines require (a
                            value the caller already set is kept)

In the script, ``numba_flash.distributed.init_ring()`` reads them, selects the GPU and
builds the communicator (``cupy.cuda.nccl.NcclCommunicator``) and its
``distributed.NcclRing``::

    ring = numba_flash.distributed.init_ring()
    out = numba_flash.distributed.ring_attention(q_shard, k_shard, v_shard, comm=ring, causal=True)

The launcher waits for every process. If one exits with an error, it stops the others
and returns that exit code (the first to fail), so a crashed rank cannot leave the
rest blocked in a NCCL call.  ``mpirun -n 2`` works as well: ``init_ring`` then takes
the rank and size from Open MPI's or MPICH's variables, but it still needs
``NUMBA_FLASH_NCCL_ID`` set the same on every rank (``numba-flash launch --print-id``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

RANK, WORLD, NCCL_ID = "NUMBA_FLASH_RANK", "NUMBA_FLASH_WORLD_SIZE", "NUMBA_FLASH_NCCL_ID"
#: Where ``init_ring`` finds the rank and size when no launcher set them (mpirun).
MPI_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
MPI_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def nccl_unique_id() -> str:
    """A fresh NCCL unique id, as hex (CuPy's ``nccl.get_unique_id()``)."""
    import warnings

    try:
        with warnings.catch_warnings():  # CuPy warns when libnccl is missing; the error below says it
            warnings.simplefilter("ignore")
            from cupy.cuda import nccl
    except ImportError as exc:
        raise RuntimeError(f"NCCL through CuPy is not importable ({exc}): the ring needs cupy with NCCL") from None
    if not getattr(nccl, "available", False) or not hasattr(nccl, "get_unique_id"):
        raise RuntimeError("CuPy's NCCL library could not be loaded (libnccl.so.2): install nvidia-nccl for your "
                           "CUDA, as CuPy's warning says")  # fmt: skip
    return bytes(b & 0xFF for b in nccl.get_unique_id()).hex()


def gpu_count() -> int:
    """The GPUs of this host (``launch``'s default process count)."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # noqa: BLE001 (no CUDA: said as a RuntimeError)
        raise RuntimeError(f"no GPU to count ({type(exc).__name__}: {str(exc)[:80]}); give --nproc") from None


def unique_id_tuple(hex_id: str) -> tuple:
    """The unique id CuPy's ``NcclCommunicator`` takes, from its hex form (signed bytes,
    as ``nccl.get_unique_id()`` gives them)."""
    raw = bytes.fromhex(hex_id)
    return tuple(b - 256 if b > 127 else b for b in raw)


def rank_env(rank: int, world: int, nccl_id: str, base: dict | None = None) -> dict:
    """The environment of rank ``rank`` (module docstring)."""
    env = dict(os.environ if base is None else base)
    env.update({RANK: str(rank), WORLD: str(world), NCCL_ID: nccl_id})
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    return env


def launch(script: str, args=(), *, nproc: int, nccl_id: str | None = None, python: str = sys.executable,
           poll_s: float = 0.2) -> int:  # fmt: skip
    """Run ``python script args...`` in ``nproc`` processes (module docstring); return 0
    when all succeed, else the first failing exit code (the others are stopped).
    ``nccl_id``: the unique id to hand out (default: a fresh one)."""
    if nproc < 1:
        raise ValueError(f"nproc={nproc}: expected >= 1")
    if not os.path.isfile(script):
        raise ValueError(f"script={script!r}: no such file")
    nccl_id = nccl_unique_id() if nccl_id is None else nccl_id
    procs = [subprocess.Popen([python, script, *args], env=rank_env(r, nproc, nccl_id)) for r in range(nproc)]
    failed = 0
    try:
        while True:
            codes = [p.poll() for p in procs]  # every process polled (not any(): it would stop at the first)
            bad = [c for c in codes if c not in (None, 0)]
            if bad:
                failed = bad[0]
                break
            if all(c is not None for c in codes):
                break
            time.sleep(poll_s)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    if failed:
        return failed
    return next((p.returncode for p in procs if p.returncode), 0)


def rank_and_world() -> tuple[int, int]:
    """``(rank, world)`` from the launcher's variables, else from mpirun's."""
    env = os.environ
    if RANK in env and WORLD in env:
        return int(env[RANK]), int(env[WORLD])
    rank = next((int(env[k]) for k in MPI_RANK_VARS if k in env), None)
    world = next((int(env[k]) for k in MPI_SIZE_VARS if k in env), None)
    if rank is None or world is None:
        raise RuntimeError(f"no rank: start the processes with `numba-flash launch` (which sets {RANK} and {WORLD}) "
                           "or mpirun")  # fmt: skip
    return rank, world
