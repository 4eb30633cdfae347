"""Running the benchmark: :func:`measure` (one implementation, case and pass) and
:func:`run_bench` (every implementation on every case and pass).

A varlen case's input sets hold its padded batch; an implementation without a varlen
entry runs that padded batch (``Impl.run_case``), and its row keeps the varlen case (its
FLOPs count the real pairs) with ``padded`` set.  ``numba-flash-padded`` runs on varlen
cases only: dense cases get no row of it.

An implementation that cannot run a case is *reported*, never a crash: torch not
importable or without that backend → ``unavailable``; a backend refusing the dtype or
shape (e.g. flash with float32) → ``unsupported``; out of device memory → ``oom`` (CuPy
and torch caches are emptied afterwards); anything else → ``error`` with the message.
"""

from __future__ import annotations

import warnings
from typing import Callable, Iterable, Sequence

from numba_flash.bench.cases import PASSES, BenchCase
from numba_flash.bench.peers import IMPLS, Impl, make_impls
from numba_flash.bench.report import BenchResult, add_derived
from numba_flash.bench.timing import InputSet, free_bytes, is_oom, l2_bytes, release_memory, require_device, rotation_count, time_fn


def _short(exc: BaseException, limit: int = 200) -> str:
    text = " ".join(str(exc).split())
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


def measure(impl: Impl, case: BenchCase, pass_: str, *, sets_cache: dict, warmup=5, rep=30, min_rep=5, budget_ms=1500.0, l2=None) -> BenchResult:
    """Time one implementation on one case and pass; never raises for the peer's own
    failures (they become the result's status)."""
    why = impl.unavailable()
    if why:
        return BenchResult(impl.name, pass_, case, "unavailable", why)
    run = impl.run_case(case)  # a varlen case's padded batch for an implementation without varlen
    why = impl.unsupported(run, pass_)
    if why:
        return BenchResult(impl.name, pass_, case, "unsupported", why)
    fns = setup = None
    caught: list = []
    try:
        per_set = InputSet.nbytes(case) + impl.extra_set_bytes(run, pass_)
        n_sets = rotation_count(per_set, l2=l2, free=free_bytes())
        sets = sets_cache.setdefault("sets", [])
        while len(sets) < n_sets:
            sets.append(InputSet(case, seed=1234 + len(sets)))
        with warnings.catch_warnings(record=True) as caught_now:
            warnings.simplefilter("always")
            caught = caught_now
            with impl.context():
                fns, setup = impl.prepare(run, pass_, sets[:n_sets])
                timing = time_fn(fns, warmup, rep, min_rep=min_rep, budget_ms=budget_ms, setup=setup, events=impl.events)
        return BenchResult(impl.name, pass_, case, "ok", "", timing)
    except Exception as exc:
        fns = setup = None
        if is_oom(exc):
            status, detail = "oom", "out of memory: " + _short(exc, 160)
        elif isinstance(exc, NotImplementedError):
            status, detail = "unsupported", _short(exc)
        elif "No available kernel" in str(exc):
            reasons = [str(w.message).split("\n")[0] for w in caught]
            status, detail = "unsupported", _short(exc, 80) + (" — " + "; ".join(reasons[:2]) if reasons else "")
            detail = detail[:300]
        elif isinstance(exc, (TypeError, ValueError)) and impl.name.startswith("numba-flash"):
            status, detail = "unsupported", _short(exc)
        else:
            status, detail = "error", _short(exc)
        return BenchResult(impl.name, pass_, case, status, detail)
    finally:
        fns = setup = None
        release_memory()


def run_bench(
    cases: Sequence[BenchCase],
    *,
    impls: Iterable[str] = IMPLS,
    passes: Iterable[str] = PASSES,
    layout: str = "bshd",
    warmup: int = 5,
    rep: int = 30,
    min_rep: int = 5,
    budget_ms: float = 1500.0,
    progress: Callable[[int, int, str], None] | None = None,
) -> list[BenchResult]:
    """Time every implementation on every case and pass; returns the rows with derived
    forward+backward rows and ratios (see :func:`add_derived`).

    ``progress(done, total, description)`` is called before each measurement and once
    at the end.  Raises :class:`NoDeviceError` without a CUDA device.
    """
    require_device()
    passes = tuple(passes)
    for p in passes:
        if p not in PASSES:
            raise ValueError(f"passes: expected a subset of {PASSES}, got {p!r}")
    impl_objs = make_impls(impls, layout=layout)
    l2 = l2_bytes()
    runs = {case: [i for i in impl_objs if case.varlen or not i.varlen_only] for case in cases}
    total = len(passes) * sum(len(r) for r in runs.values())
    done = 0
    results = []
    for case in cases:
        cache: dict = {}
        try:
            for pass_ in passes:
                for impl in runs[case]:
                    if progress is not None:
                        progress(done, total, f"{case.label} · {pass_} · {impl.name}")
                    try:
                        results.append(
                            measure(impl, case, pass_, sets_cache=cache, warmup=warmup, rep=rep,
                                    min_rep=min_rep, budget_ms=budget_ms, l2=l2)
                        )  # fmt: skip
                    except Exception as exc:  # the inputs themselves did not fit, say
                        status = "oom" if is_oom(exc) else "error"
                        results.append(BenchResult(impl.name, pass_, case, status, _short(exc)))
                        release_memory()
                    done += 1
        finally:
            cache.clear()
            release_memory()
    if progress is not None:
        progress(done, total, "done")
    return add_derived(results)
