"""Test-suite setup and the helpers the test modules share.

The same test code runs the kernels in numba's CUDA simulator on a CPU-only machine
(tiny shapes; CI does this) and on a real GPU, where tests marked ``gpu`` add the
real sizes.  The choice has to be made before numba is imported.

Shared here: ``rng`` (a fresh generator that remembers its seed for failure messages),
``poisoned_outputs`` (every array the API allocates starts as NaN, so an element a
kernel forgets to write fails the comparison; modules opt in with
``pytestmark = pytest.mark.usefixtures("poisoned_outputs")``), ``host``, ``make_qkv``,
``grad_errors`` and ``family`` (the launch plan's family of a problem).
"""

import contextlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from numba_flash._gpu_probe import use_simulator_without_gpu  # noqa: E402

SIMULATOR = use_simulator_without_gpu()

import numpy as np  # noqa: E402
import pytest  # noqa: E402

FWD_TOL = 1e-5  # fp32: relative error of O and LSE
BWD_TOL = 1e-4  # fp32: relative error of dQ, dK, dV


def pytest_configure(config):
    """Under the simulator, pin each pytest-xdist worker to one core of its own: the
    simulator runs a block's threads as Python threads that the launching thread polls,
    and with several free cores they pass the GIL back and forth across cores and every
    launch gets several times slower (measured: the numerics and determinism tests took
    57 s pinned, 115 s unpinned, on a 2-core machine)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if SIMULATOR and worker.startswith("gw") and hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[int(worker[2:]) % len(cpus)]})


def pytest_report_header(config):
    return "numba-flash kernels run in: " + ("the CUDA simulator (no GPU)" if SIMULATOR else "a CUDA GPU")


def pytest_runtest_logreport(report):
    """``NUMBA_FLASH_FAILURE_LOG=path``: each failure's traceback appended to ``path`` as the
    test ends (under pytest-xdist, in the controller, one at a time), so that a run a time
    limit kills still leaves its failures' reasons; pytest prints them only at the end
    (session 30's device calls lost all but one that way)."""
    path = os.environ.get("NUMBA_FLASH_FAILURE_LOG")
    if path and report.failed and "PYTEST_XDIST_WORKER" not in os.environ:  # a worker's report reaches the controller
        with open(path, "a") as f:
            f.write(f"==== {report.nodeid} ({report.when})\n{report.longreprtext}\n")


def pytest_collection_modifyitems(config, items):
    if not SIMULATOR:
        return
    skip = pytest.mark.skip(reason="real-size GPU case: needs a CUDA device (the CUDA simulator is on here)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


class SeededRng:
    """A fresh NumPy generator that remembers its seed for failure messages."""

    def __init__(self):
        self.seed_value = int(np.random.SeedSequence().entropy % 2**32)
        self._gen = np.random.default_rng(self.seed_value)

    def standard_normal(self, shape):
        return self._gen.standard_normal(shape)

    def integers(self, *args, **kw):
        return self._gen.integers(*args, **kw)

    def choice(self, *args, **kw):
        return self._gen.choice(*args, **kw)

    def random(self, *args, **kw):
        return self._gen.random(*args, **kw)

    def permutation(self, *args, **kw):
        return self._gen.permutation(*args, **kw)


@pytest.fixture
def rng():
    return SeededRng()


@pytest.fixture
def poisoned_outputs():
    """Every array the API allocates for an output starts as NaN (``numba_flash.check``'s
    :func:`~numba_flash.check.poisoned_outputs`, as ``numba-flash check`` runs)."""
    from numba_flash.check import poisoned_outputs as poisoned

    with poisoned():
        yield


def host(x):
    """A NumPy copy of a NumPy or CuPy array."""
    return x.get() if hasattr(x, "get") else np.asarray(x)


def device(x):
    """``x`` where the kernels run: the array itself in the simulator, CuPy on a GPU."""
    if SIMULATOR:
        return x
    import cupy

    return cupy.asarray(x)


def device_kw(kw):
    """Keyword arguments with their NumPy arrays (ALiBi slopes, …) where the kernels run."""
    return {key: (device(val) if isinstance(val, np.ndarray) else val) for key, val in kw.items()}


@contextlib.contextmanager
def kernels_launched():
    """The names of the kernels the API launches inside the block (each call's own plan,
    with its variants), appended to the yielded list."""
    from unittest import mock

    from numba_flash import api

    ran = []
    run = api._run
    with mock.patch.object(api, "_run", lambda plan, *a: (ran.extend(x.name for x in plan.launches), run(plan, *a))):
        yield ran


def make_qkv(rng, B, H, Nq, Nk, d, layout, dtype=np.float32):
    """Standard-normal q (Nq rows), k and v (Nk rows) in ``layout``, rounded to ``dtype``."""

    def one(n):
        shape = (B, n, H, d) if layout == "bshd" else (B, H, n, d)
        return rng.standard_normal(shape).astype(dtype)

    return one(Nq), one(Nk), one(Nk)


def lse_error(lse, ref_lse):
    """lse's largest error over ``max(max |ref|, 1)``: an lse carries its scores'
    rounding, whose scale is that of the scores (about 1 in these tests), not its own.
    One key whose score nearly cancels (lse 4e-4 at q1k1) gave a relative error of
    1.6e-5 from an absolute one of 6.6e-9 (a float32 dot product of 16 terms)."""
    from numba_flash import reference

    ref = np.abs(np.asarray(ref_lse, dtype=np.float64))
    ref = ref[np.isfinite(ref)]
    return reference.max_abs_error(lse, ref_lse) / max(float(ref.max()) if ref.size else 0.0, 1.0)


def seen_lse_error(lse, ref_lse):
    """lse's relative error (``reference.rel_error``) over the rows that see a key: the rows
    where ``ref_lse`` is −inf count 0 on both sides (callers assert those rows apart)."""
    from numba_flash import reference

    blind = np.isneginf(ref_lse)
    return reference.rel_error(np.where(blind, 0, lse), np.where(blind, 0, ref_lse))


def grad_errors(grads, ref_grads):
    """Relative errors of (dq, dk, dv), each normalised by max(max |ref|, 1e-3 · the
    largest reference gradient of the problem).  The floor matters when a gradient is
    zero in exact arithmetic: with a single key, P = 1 and dS = dP − delta = 0, so dq and
    dk hold only rounding noise in the kernel and the reference alike."""
    floor = 1e-3 * max(float(np.max(np.abs(g))) for g in ref_grads)
    errs = []
    for got, want in zip(grads, ref_grads):
        got = host(got).astype(np.float64)
        if not np.all(np.isfinite(got)):
            errs.append(np.inf)
            continue
        errs.append(float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), floor, 1e-30)))
    return errs


def family(pass_, dtype, head_dim, aligned=True, allow_tf32=False, arch=(9, 0)):
    """The family the launch plan picks for a problem."""
    from numba_flash import _arrays, plan

    name = dtype if isinstance(dtype, str) else _arrays.dtype_name(np.dtype(dtype))
    return plan.family(plan.Problem(pass_, name, head_dim, aligned=aligned, allow_tf32=allow_tf32, arch=arch))[0]


def launch_names(pass_, dtype, head_dim, causal=False, **kw):
    """The kernel names of a problem's launch plan, in order."""
    from numba_flash import plan

    return [k.name for k in plan.plan(plan.Problem(pass_, dtype, head_dim, causal, **kw)).launches]
