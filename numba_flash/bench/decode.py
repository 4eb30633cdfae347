"""Decode steps against a KV cache: bandwidth of ``flash_attention_with_kvcache`` and
its workspace (``numba-flash bench --decode``, ``numba-flash memory --decode``).

A decode step reads the cache once: ``kv_bytes = 2 · B · H_kv · L · d · itemsize`` (K
and V of L cached keys), so its speed is a bandwidth, ``kv_bytes / time``, compared with
the device's copy bandwidth (:func:`copy_bandwidth`: a device-to-device copy, bytes read
plus written over its time; 4.27 TB/s on the H200).

Times (:func:`run_decode`), each a median of CUDA events:

``queued``  10 back-to-back calls between two events (the host's time per call hidden
            behind the GPU's when it is shorter: a Python decode loop's speed);
``graph``   10 replays of one call captured in a CUDA graph (the GPU's time of the step
            without the host's: how a serving loop runs its decode steps).  A call
            that cannot be captured reports why.

Peers on the same shape: torch SDPA's flash (FlashAttention-2) and cuDNN backends on a
contiguous cache (``enable_gqa``, or K/V repeated where a backend refuses it).

Workspace (:func:`workspace_model`): what a step allocates beyond its output, fp32
partial outputs and log-sum-exps of ``splits`` parts of ``B · H`` rows (none where the
splits of a row tile merge in a thread-block cluster, ``kvcache.cluster_of``), the merged
log-sum-exp, and the small int arrays (with a paged cache, a copy of the block table):
it grows with B · H · splits, not with the cache length.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

SCHEMA = "numba-flash-bench-decode/1"
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4}


@dataclass(frozen=True)
class DecodeCase:
    """One decode step: ``batch`` sequences of one new query each (``seqlen_q``), ``heads``
    query heads on ``heads_k`` KV heads, caches of ``cache_len`` keys, contiguous
    (``page_size`` 0) or paged, ``num_splits`` (0: the library's choice)."""

    cache_len: int
    batch: int = 8
    heads: int = 32
    heads_k: int = 8
    head_dim: int = 128
    dtype: str = "float16"
    page_size: int = 0
    num_splits: int = 0
    seqlen_q: int = 1

    def __post_init__(self):
        for name in ("cache_len", "batch", "heads", "heads_k", "head_dim", "seqlen_q"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: expected >= 1")
        if self.heads % self.heads_k:
            raise ValueError(f"heads={self.heads}: expected a multiple of heads_k={self.heads_k}")
        if self.dtype not in ITEMSIZE:
            raise ValueError(f"dtype={self.dtype!r}: expected one of {tuple(ITEMSIZE)}")
        if self.page_size and self.cache_len % self.page_size:
            raise ValueError(f"page_size={self.page_size}: expected a divisor of cache_len={self.cache_len}")

    @property
    def layout(self) -> str:
        return f"paged {self.page_size}" if self.page_size else "contiguous"

    @property
    def kv_bytes(self) -> int:
        """Bytes of K and V a step reads."""
        return 2 * self.batch * self.heads_k * self.cache_len * self.head_dim * ITEMSIZE[self.dtype]


def decode_cases(cache_lens, *, page_sizes=(0, 256), **shape) -> list[DecodeCase]:
    """A case per cache length and layout (``page_size`` 0: contiguous)."""
    return [DecodeCase(L, page_size=p, **shape) for L in cache_lens for p in page_sizes]


def splits_of(case: DecodeCase) -> int:
    """The split count the call takes for ``case`` (``kvcache._launch_plan``: the same
    choice, for the current device or the simulator's 132 SMs)."""
    return plan_of(case)[0]


def plan_of(case: DecodeCase) -> tuple[int, int]:
    """``(splits, cluster)`` of the call for ``case``: :func:`splits_of`, and the CTAs of
    the thread-block cluster its splits merge in (``Variant.cluster``; 0: none)."""
    from numba_flash import kvcache
    from numba_flash.api import _device_id

    swap, rows, heads = kvcache.decode_swap(case.seqlen_q, case.heads, case.heads_k)
    features = _features(case)
    page_rows = case.page_size if case.page_size and case.cache_len > case.page_size else 0  # (as the call's)
    plan, splits, _ = kvcache._launch_plan(features, swap, case.dtype, case.head_dim, False, True, case.batch, heads,
                                           rows, case.cache_len, case.heads_k, case.num_splits,
                                           _device_id(), None, page_rows)  # fmt: skip
    return splits, plan.problem.features.cluster


def _features(case: DecodeCase):
    from numba_flash.variant import Variant

    return Variant(varlen=True, gqa=case.heads != case.heads_k)


def workspace_model(case: DecodeCase, splits: int, cluster: int = 0) -> dict:
    """Bytes a step allocates beyond its output (module docstring), by part; ``cluster``
    (:func:`plan_of`): the splits merge in a thread-block cluster, with no parts in HBM."""
    from numba_flash.kvcache import decode_swap

    rows = case.batch * case.seqlen_q * case.heads
    merged = splits > 1 or decode_swap(case.seqlen_q, case.heads, case.heads_k)[0]
    pages = case.cache_len // case.page_size if case.page_size else 1
    parts = {
        "partial_out": splits * rows * case.head_dim * 4 if merged and not cluster else 0,
        "partial_lse": 0 if cluster else splits * rows * 4,
        "lse": rows * 4 if merged else 0,
        "ints": 4 * (case.batch * (1 + pages) + 5 + 2 * (case.batch + 1)),  # (kvcache's packed upload)
    }
    parts["total"] = sum(parts.values())
    return parts


@dataclass
class DecodeResult:
    case: DecodeCase
    splits: int = 0
    queued_ms: float = math.nan
    graph_ms: float = math.nan
    graph_error: str = ""
    copy_tbs: float = math.nan
    peers: dict = field(default_factory=dict)  # name -> (ms, how)
    status: str = "ok"
    detail: str = ""

    def tbs(self, ms: float) -> float:
        return self.case.kv_bytes / ms / 1e9 if ms and ms > 0 else math.nan

    def to_dict(self) -> dict:
        row = {**asdict(self.case), "layout": self.case.layout, "kv_bytes": self.case.kv_bytes, "splits": self.splits,
               "queued_ms": self.queued_ms, "queued_tbs": self.tbs(self.queued_ms),
               "queued_of_copy": self.tbs(self.queued_ms) / self.copy_tbs, "graph_ms": self.graph_ms,
               "graph_tbs": self.tbs(self.graph_ms), "graph_of_copy": self.tbs(self.graph_ms) / self.copy_tbs,
               "graph_error": self.graph_error, "copy_tbs": self.copy_tbs, "status": self.status,
               "detail": self.detail}  # fmt: skip
        for name, (ms, how) in self.peers.items():
            row[f"{name}_ms"], row[f"{name}_how"] = ms, how
            row[f"{name}_ratio"] = ms / self.queued_ms if self.queued_ms == self.queued_ms else math.nan
        return row


def copy_bandwidth(nbytes: int = 2 << 30) -> float:
    """TB/s of a device-to-device copy of ``nbytes`` (read + written over the time)."""
    import cupy as cp

    from numba_flash.bench.timing import time_fn

    src = cp.ones(nbytes // 4, cp.float32)
    dst = cp.empty_like(src)
    t = time_fn(lambda: dst.__setitem__(slice(None), src), warmup=2, rep=10)
    return 2 * nbytes / t.ms / 1e9


def _event_ms(run, calls: int, rep: int, stream=None) -> float:
    """Median over ``rep`` of CUDA events around ``calls`` runs of ``run()`` on
    ``stream`` (None: the current one), divided by ``calls``."""
    import statistics

    import cupy as cp

    times = []
    for _ in range(rep):
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record(stream)
        for _ in range(calls):
            run()
        e.record(stream)
        e.synchronize()
        times.append(cp.cuda.get_elapsed_time(s, e) / calls)
    return statistics.median(times)


def queued_ms(fn, calls: int = 10, rep: int = 9, warmup: int = 1) -> float:
    """Median ms a call: CUDA events around ``calls`` back-to-back calls, divided by
    ``calls`` (more than 1: the host's time per call hides behind the GPU's when it is
    shorter, as torch.utils.benchmark times FlashAttention-2), after ``warmup`` calls."""
    import cupy as cp

    for _ in range(warmup):
        fn()
    cp.cuda.runtime.deviceSynchronize()
    return _event_ms(fn, calls, rep)


def graph_ms(fn, calls: int = 10, rep: int = 9) -> tuple[float, str]:
    """Median ms of one call captured in a CUDA graph and replayed, or (NaN, why)."""
    import cupy as cp

    stream = cp.cuda.Stream(non_blocking=True)
    try:
        with stream:
            fn()
            stream.synchronize()
            stream.begin_capture()
            fn()
            graph = stream.end_capture()
            return _event_ms(lambda: graph.launch(stream), calls, rep, stream), ""
    except Exception as exc:  # noqa: BLE001 (reported in the table, not hidden)
        return math.nan, f"{type(exc).__name__}: {str(exc)[:80]}"


def make_step(case: DecodeCase, seed: int = 0):
    """``(step, q, k_cache, v_cache, kw)``: the decode call of ``case`` on random data
    (a paged cache holds the contiguous one's rows through a shuffled block table)."""
    import cupy as cp
    import numpy as np

    import numba_flash
    from numba_flash import _arrays as A

    rng = np.random.default_rng(seed)
    dt = A.SUPPORTED_BY_NAME[case.dtype]
    B, L, Hk, d = case.batch, case.cache_len, case.heads_k, case.head_dim

    dev_rng = cp.random.RandomState(seed)  # on the device: a 131072-key cache is 2 G values

    def randn(*shape):
        return dev_rng.standard_normal(shape, dtype=cp.float32).astype(dt)

    q = randn(B, case.seqlen_q, case.heads, d)
    kw = {"cache_seqlens": L, "num_splits": case.num_splits}  # the whole cache: the step reads every key
    if case.page_size:
        per = L // case.page_size
        table = rng.permutation(B * per).reshape(B, per).astype(np.int32)
        k_cache, v_cache = randn(B * per, case.page_size, Hk, d), randn(B * per, case.page_size, Hk, d)
        kw["block_table"] = table
    else:
        k_cache, v_cache = randn(B, L, Hk, d), randn(B, L, Hk, d)

    def step():
        return numba_flash.flash_attention_with_kvcache(q, k_cache, v_cache, **kw)

    return step, q, k_cache, v_cache, kw


def sdpa_peers(case: DecodeCase, q, k_cache, v_cache) -> dict:
    """``{"sdpa_flash": (ms, how), "sdpa_cudnn": (ms, how)}`` on a contiguous cache, or
    {} when torch is not importable."""
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return {}
    F = torch.nn.functional.scaled_dot_product_attention
    tq, tk, tv = (torch.as_tensor(x, device="cuda").transpose(1, 2) for x in (q, k_cache, v_cache))
    got = {}
    for name, backend in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
        with sdpa_kernel(backend):
            try:
                F(tq, tk, tv, enable_gqa=True)
                got[name] = (queued_ms(lambda: F(tq, tk, tv, enable_gqa=True)), "gqa")
            except RuntimeError:
                ek, ev = (x.repeat_interleave(case.heads // case.heads_k, dim=1) for x in (tk, tv))
                try:
                    F(tq, ek, ev)
                    got[name] = (queued_ms(lambda: F(tq, ek, ev)), "kv repeated")
                except RuntimeError as exc:
                    got[name] = (math.nan, str(exc).splitlines()[0][:60])
    return got


def run_decode(cases, *, peers: bool = True, progress=None) -> list[DecodeResult]:
    """Time every case (module docstring); one result each, an error reported in it."""
    from numba_flash.bench.run import _short
    from numba_flash.bench.timing import release_memory

    copy = copy_bandwidth()
    results = []
    for n, case in enumerate(cases):
        res = DecodeResult(case, copy_tbs=copy)
        try:
            step, q, kc, vc, _ = make_step(case)
            res.splits = splits_of(case)
            res.queued_ms = queued_ms(step)
            res.graph_ms, res.graph_error = graph_ms(step)
            if peers and not case.page_size:
                res.peers = sdpa_peers(case, q, kc, vc)
            del step, q, kc, vc
        except Exception as exc:  # noqa: BLE001 (a failed case is a row, not a crash)
            res.status, res.detail = ("oom" if "out of memory" in str(exc).lower() else "error"), _short(exc)
        release_memory()
        results.append(res)
        if progress:
            progress(n + 1, len(cases), f"decode {case.cache_len} keys {case.layout}")
    return results


def measure_workspace(case: DecodeCase) -> tuple[int, int]:
    """``(peak bytes, output bytes)`` of one decode step in a fresh CuPy pool
    (``memory.measure_peak``), after a warm-up call outside it."""
    from numba_flash.memory import measure_peak

    step, q, *_ = make_step(case)
    step()  # the plan, the kernels and the uploaded ints exist before the measured call
    peak, out_bytes = measure_peak(step, lambda out: int(out.nbytes))
    return peak, out_bytes


def decode_memory(cases, *, progress=None) -> list[dict]:
    """Per case: the split count, the workspace :func:`workspace_model` predicts and the
    one measured (peak of a fresh pool − the output, :func:`measure_workspace`)."""
    from numba_flash.bench.run import _short
    from numba_flash.bench.timing import release_memory

    rows = []
    for n, case in enumerate(cases):
        row = {**asdict(case), "layout": case.layout, "cache_bytes": case.kv_bytes, "status": "ok", "detail": ""}
        try:
            splits, cluster = plan_of(case)
            model = workspace_model(case, splits, cluster)
            row.update(splits=splits, cluster=cluster, predicted_workspace_bytes=model["total"], predicted_parts=model)
            peak, out_bytes = measure_workspace(case)
            row.update(peak_bytes=peak, output_bytes=out_bytes, workspace_bytes=max(0, peak - out_bytes))
        except Exception as exc:  # noqa: BLE001 (a failed case is a row, not a crash)
            row.update(status="oom" if "out of memory" in str(exc).lower() else "error", detail=_short(exc))
        release_memory()
        rows.append(row)
        if progress:
            progress(n + 1, len(cases), f"workspace {case.cache_len} keys {case.layout}")
    return rows
