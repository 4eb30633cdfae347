"""Context-parallel ring attention (issue #15): each rank holds a contiguous shard of the
sequence (or two, zigzag), K/V shards travel around the ring, and each rank merges the
partial attentions of its queries exactly through their log-sum-exps.

Algorithm (W ranks; rank r holds query and key chunks ``chunks(r)``):

* **Forward.** At hop t = 0 .. W−1 rank r has the K/V chunks of rank ``(r − t) mod W``.
  For every (query chunk, key chunk) pair it runs ``flash_attention`` (causal on the
  diagonal pair, full where the keys precede the queries, skipped where they follow)
  and keeps (out, lse). Then the chunks it holds go to rank r + 1. At the end
  ``merge_attention`` combines each query chunk's parts, in hop order.
* **Backward.** The same walk with the merged out and lse: ``flash_attention_backward``
  of a pair gives its exact share of dQ (summed at home) and of dK, dV. Those travel
  with K and V in float32 accumulators and reach their owner after a last hop. Every
  sum runs in hop order, so the result is deterministic.
* **Shards.** :func:`shard` / :func:`unshard`. Contiguous: rank r holds chunk r of W.
  Zigzag: rank r holds chunks r and 2W − 1 − r of 2W, which balances causal work.

The per-rank steps are a generator (``_forward_steps``, ``_backward_steps``) that
yields the arrays it sends to rank r + 1 and is resumed with a handle on what it
receives from rank r − 1. :func:`ring_attention` drives it over a communicator;
:func:`run_local` drives W of them in lockstep in one process (the simulator's test
transport), so both use the same code.

Communicators: :func:`run_local` (in one process); :class:`NcclRing` wraps CuPy's
``cupy.cuda.nccl.NcclCommunicator`` (one process per GPU): a hop is a NCCL send to r + 1
and a recv from r − 1 on a communication stream, started before the hop's attention and
waited for after it (double buffered). NcclRing has not run on two GPUs yet.

Processes: ``numba-flash launch -n 2 script.py`` (``numba_flash.launch``) starts one per
GPU with its rank and the NCCL unique id in the environment; :func:`init_ring` turns them
into a ring (``scripts/ring_attention_example.py``).
"""

from __future__ import annotations

import numpy as np

from numba_flash import _arrays as A


def _chunks(rank: int, world: int, zigzag: bool) -> tuple:
    """Chunk indices rank ``rank`` holds, in order: (r,) of W, or (r, 2W − 1 − r) of 2W."""
    return (rank, 2 * world - 1 - rank) if zigzag else (rank,)


def shard(x, world: int, rank: int, *, zigzag: bool = False, axis: int = 1):
    """Rank ``rank``'s part of ``x`` along the sequence ``axis`` (bshd: 1): chunk r of
    ``world``, or zigzag chunks r and 2W − 1 − r of 2W, concatenated.  The length must be
    a multiple of the chunk count."""
    n = x.shape[axis]
    parts = 2 * world if zigzag else world
    if n % parts:
        raise ValueError(f"x: sequence length {n} along axis {axis}: expected a multiple of {parts} "
                         f"({'2·' if zigzag else ''}world = {parts})")  # fmt: skip
    c = n // parts
    xp = np if isinstance(x, np.ndarray) else A._cupy()
    return xp.concatenate([_slice(x, i * c, (i + 1) * c, axis) for i in _chunks(rank, world, zigzag)], axis=axis)


def unshard(shards, *, zigzag: bool = False, axis: int = 1):
    """The full sequence from every rank's :func:`shard`, in rank order."""
    world = len(shards)
    xp = np if isinstance(shards[0], np.ndarray) else A._cupy()
    per = 2 if zigzag else 1
    c = shards[0].shape[axis] // per
    chunks = {}
    for r, s in enumerate(shards):
        for j, i in enumerate(_chunks(r, world, zigzag)):
            chunks[i] = _slice(s, j * c, (j + 1) * c, axis)
    return xp.concatenate([chunks[i] for i in range(per * world)], axis=axis)


def _pair_mode(q_chunk: int, k_chunk: int, causal: bool):
    """How query chunk ``q_chunk`` sees key chunk ``k_chunk`` (equal lengths): "full",
    "causal" (the diagonal) or None (every key after every query)."""
    if not causal or k_chunk < q_chunk:
        return "full"
    return "causal" if k_chunk == q_chunk else None


def _slice(x, a, b, axis):
    """``x[..., a:b, ...]`` along ``axis`` (a view)."""
    idx = [slice(None)] * x.ndim
    idx[axis] = slice(a, b)
    return x[tuple(idx)]


def _split(x, parts, axis=1):
    """``parts`` equal views of ``x`` along ``axis``."""
    c = x.shape[axis] // parts
    return [_slice(x, i * c, (i + 1) * c, axis) for i in range(parts)]


def _forward_steps(q, k, v, rank, world, causal, scale, zigzag):
    """Rank ``rank``'s forward (module docstring): yields the (k, v) it sends, receives a
    handle whose ``wait()`` gives the (k, v) of rank r − 1; returns (out, lse) of its
    query chunks, concatenated (bshd; lse (B, H, N))."""
    import numba_flash

    xp = np if isinstance(q, np.ndarray) else A._cupy()
    mine = _chunks(rank, world, zigzag)
    q_parts = _split(q, len(mine))
    partial = [[] for _ in mine]  # per query chunk: (out, lse) in hop order
    held = (k, v)
    for t in range(world):
        owner = (rank - t) % world
        handle = (yield held) if t < world - 1 else None  # the next hop starts before this one's work
        k_parts, v_parts = _split(held[0], len(mine)), _split(held[1], len(mine))
        for a, qc in enumerate(mine):
            for b, kc in enumerate(_chunks(owner, world, zigzag)):
                mode = _pair_mode(qc, kc, causal)
                if mode is not None:
                    partial[a].append(numba_flash.flash_attention(q_parts[a], k_parts[b], v_parts[b],
                                                                  causal=mode == "causal", softmax_scale=scale,
                                                                  return_lse=True))  # fmt: skip
        if handle is not None:
            held = handle.wait()
    outs, lses = [], []
    for parts in partial:
        o, lse = numba_flash.merge_attention(xp.stack([p[0] for p in parts]), xp.stack([p[1] for p in parts]))
        outs.append(o.astype(q.dtype))
        lses.append(lse)
    return xp.concatenate(outs, axis=1), xp.concatenate(lses, axis=2)


def _backward_steps(dout, q, k, v, out, lse, rank, world, causal, scale, zigzag):
    """Rank ``rank``'s backward: at each hop it adds its share to the float32 gradient
    accumulators of the K/V it holds, then yields (k, v, dk, dv) to rank r + 1 and
    takes rank r − 1's; after W hops its own K/V come home with every rank's share.
    Returns (dq, dk, dv) of its shard."""
    import numba_flash

    xp = np if isinstance(q, np.ndarray) else A._cupy()
    mine = _chunks(rank, world, zigzag)
    n = len(mine)
    q_parts, do_parts, o_parts = _split(q, n), _split(dout, n), _split(out, n)
    l_parts = _split(lse, n, axis=2)
    dq = xp.zeros(q.shape, np.float32)
    dq_parts = _split(dq, n)  # views: the sums land in dq
    held = (k, v, xp.zeros(k.shape, np.float32), xp.zeros(v.shape, np.float32))
    for t in range(world):
        owner = (rank - t) % world
        kk, vv, dk_acc, dv_acc = held
        k_parts, v_parts = _split(kk, n), _split(vv, n)
        dk_parts, dv_parts = _split(dk_acc, n), _split(dv_acc, n)
        for a, qc in enumerate(mine):
            for b, kc in enumerate(_chunks(owner, world, zigzag)):
                mode = _pair_mode(qc, kc, causal)
                if mode is None:
                    continue
                g = numba_flash.flash_attention_backward(do_parts[a], q_parts[a], k_parts[b], v_parts[b], o_parts[a],
                                                         l_parts[a], causal=mode == "causal", softmax_scale=scale)
                dq_parts[a] += g[0].astype(np.float32)
                dk_parts[b] += g[1].astype(np.float32)
                dv_parts[b] += g[2].astype(np.float32)
        handle = yield (kk, vv, dk_acc, dv_acc)
        held = handle.wait()
    _, _, dk, dv = held  # after W hops: this rank's own K/V and their gradients
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


class _Done:
    def __init__(self, value):
        self.value = value

    def wait(self):
        return self.value


def run_local(steps):
    """Drive W rank generators (``_forward_steps`` / ``_backward_steps``) in lockstep in
    one process, each hop handing rank r what rank r − 1 yielded (the CPU and simulator
    tests' transport); returns their results in rank order."""
    world = len(steps)
    results = [None] * world
    sent = [None] * world
    live = set(range(world))
    for r, g in enumerate(steps):
        try:
            sent[r] = next(g)
        except StopIteration as stop:  # one rank: no hop
            results[r] = stop.value
            live.discard(r)
    while live:
        nxt = list(sent)
        for r in sorted(live):
            try:
                nxt[r] = steps[r].send(_Done(sent[(r - 1) % world]))
            except StopIteration as stop:
                results[r] = stop.value
                live.discard(r)
        sent = nxt
    return results


class _Arrived:
    """A hop in flight: ``wait()`` orders the current stream after it and gives the
    received arrays."""

    def __init__(self, event, arrays):
        self.event, self.arrays = event, arrays

    def wait(self):
        import cupy as cp

        cp.cuda.get_current_stream().wait_event(self.event)
        return self.arrays


class NcclRing:
    """A ring over ``cupy.cuda.nccl.NcclCommunicator`` ``comm`` (``rank``, ``world``): a
    hop sends arrays to rank + 1 and receives same-shaped ones from rank − 1 inside one
    NCCL group, on its own stream; ``wait()`` makes the current stream wait for it.
    Not yet run on two GPUs."""

    def __init__(self, comm, rank: int, world: int):
        import cupy as cp

        self.comm, self.rank, self.world = comm, rank, world
        self.stream = cp.cuda.Stream(non_blocking=True)

    def exchange(self, arrays):
        import cupy as cp
        from cupy.cuda import nccl

        recv = [cp.empty_like(a) for a in arrays]
        ready = cp.cuda.Event()
        ready.record()  # the arrays are complete on the compute stream
        self.stream.wait_event(ready)
        nxt, prv = (self.rank + 1) % self.world, (self.rank - 1) % self.world
        nccl.groupStart()
        for a, b in zip(arrays, recv):
            self.comm.send(a.data.ptr, a.nbytes, nccl.NCCL_CHAR, nxt, self.stream.ptr)
            self.comm.recv(b.data.ptr, b.nbytes, nccl.NCCL_CHAR, prv, self.stream.ptr)
        nccl.groupEnd()
        done = cp.cuda.Event()
        done.record(self.stream)
        return _Arrived(done, tuple(recv))


def init_ring(device: int | None = None) -> NcclRing:
    """This process's :class:`NcclRing`, from the environment ``numba-flash launch``
    sets (``numba_flash.launch``): selects GPU ``device`` (default: the rank, the
    processes being on one host) and joins the NCCL communicator of
    ``NUMBA_FLASH_NCCL_ID``."""
    import os

    import cupy as cp
    from cupy.cuda import nccl

    from numba_flash import launch as L

    rank, world = L.rank_and_world()
    if L.NCCL_ID not in os.environ:
        raise RuntimeError(f"{L.NCCL_ID} is not set: start the processes with `numba-flash launch`, or set it "
                           "to the same `numba-flash launch --print-id` on every rank")  # fmt: skip
    cp.cuda.Device(rank if device is None else device).use()
    comm = nccl.NcclCommunicator(world, L.unique_id_tuple(os.environ[L.NCCL_ID]), rank)
    return NcclRing(comm, rank, world)


def _as_ring(comm):
    """``comm`` as a ring: a :class:`NcclRing` (or any object with ``exchange``, ``rank``
    and ``world``) as it is; CuPy's ``NcclCommunicator`` (``rank_id()``, ``size()``) or
    ``cupyx.distributed.NCCLBackend`` (its ``_comm``) wrapped in one."""
    if hasattr(comm, "exchange") and hasattr(comm, "rank") and hasattr(comm, "world"):
        return comm
    inner = getattr(comm, "_comm", comm)  # cupyx.distributed.NCCLBackend holds a NcclCommunicator
    if hasattr(inner, "rank_id") and hasattr(inner, "size"):
        return NcclRing(inner, inner.rank_id(), inner.size())
    raise TypeError(f"comm: expected a NcclRing, cupy.cuda.nccl.NcclCommunicator or cupyx.distributed.NCCLBackend, "
                    f"got {type(comm).__name__}")  # fmt: skip


def _drive(gen, comm):
    """Run one rank's generator over ``comm`` (``exchange(arrays) -> handle``)."""
    try:
        sent = next(gen)
    except StopIteration as stop:
        return stop.value
    while True:
        try:
            sent = gen.send(comm.exchange(sent))
        except StopIteration as stop:
            return stop.value


def ring_attention(q, k, v, *, comm, causal=False, softmax_scale=None, return_lse=False, zigzag=False):
    """This rank's share of attention over the whole sequence, sharded over the ring
    ``comm`` (:class:`NcclRing`, :func:`init_ring`'s, or a CuPy NCCL communicator:
    ``_as_ring``): q, k, v are this rank's :func:`shard` (bshd); the
    result is this rank's shard of ``flash_attention`` on the full sequence (lse (B, H,
    N_shard))."""
    scale = A.check_scale(softmax_scale, q.shape[-1])
    comm = _as_ring(comm)
    out, lse = _drive(_forward_steps(q, k, v, comm.rank, comm.world, causal, scale, zigzag), comm)
    return (out, lse) if return_lse else out


def ring_attention_backward(dout, q, k, v, out, lse, *, comm, causal=False, softmax_scale=None, zigzag=False):
    """Gradients of :func:`ring_attention` for this rank's shard: (dq, dk, dv)."""
    scale = A.check_scale(softmax_scale, q.shape[-1])
    comm = _as_ring(comm)
    return _drive(_backward_steps(dout, q, k, v, out, lse, comm.rank, comm.world, causal, scale, zigzag), comm)
