"""Benchmark harness: numba-flash against its peers, same shapes, same data, one run.

Everything ``numba-flash bench`` prints comes from here, so it is callable from Python::

    from numba_flash import bench
    results = bench.run_bench(bench.preset_cases("fa2"), passes=("forward", "backward"))
    bench.write_json(results, "out.json"); bench.plot(results, "out.png")

The package re-exports the names of its modules, so ``bench.X`` works for all of them:

``cases``   the shapes timed (:class:`BenchCase`, presets, grids, varlen batches) and
            their FLOPs
``timing``  CUDA-event timing, input rotation past L2, device and memory helpers
``peers``   the implementations timed (``IMPLS``): numba-flash, CuPy, torch SDPA
``report``  :class:`BenchResult`, derived rows and ratios, JSON / CSV / plot output
            (the JSON schema is in its docstring)
``run``     :func:`measure` and :func:`run_bench`

Importing it imports only the standard library (CuPy, torch, numba and matplotlib are
imported inside the functions that use them): ``numba-flash --help`` stays fast.
"""

from numba_flash.bench.cases import (
    ALL_PASSES,
    DTYPES,
    PASSES,
    PRESETS,
    VARLEN_SEED,
    BenchCase,
    attention_flops,
    fa2_cases,
    preset_cases,
    shape_cases,
    tflops,
    varlen_cases,
    varlen_seqlens,
    visible_pairs,
    with_variants,
)
from numba_flash.bench.peers import (
    IMPLS,
    TORCH_BACKENDS,
    VARLEN_IMPLS,
    CupyStandard,
    Impl,
    NumbaFlash,
    TorchSDPA,
    causal_bias,
    cupy_attention_backward,
    cupy_attention_forward,
    make_impls,
)
from numba_flash.bench.report import (
    ROW_KEYS,
    SCHEMA,
    STATUSES,
    BenchResult,
    _pyplot,
    add_derived,
    csv_text,
    plot,
    rows_from_json,
    to_json_dict,
    write_csv,
    write_json,
)
from numba_flash.bench.run import _short, measure, run_bench
from numba_flash.bench.timing import (
    DEFAULT_L2_BYTES,
    L2_FACTOR,
    MAX_SETS,
    InputSet,
    NoDeviceError,
    Timing,
    free_bytes,
    is_oom,
    l2_bytes,
    release_memory,
    require_device,
    rotation_count,
    time_fn,
)

__all__ = [
    # cases
    "ALL_PASSES", "DTYPES", "PASSES", "PRESETS", "BenchCase", "attention_flops", "visible_pairs", "with_variants", "fa2_cases",
    "preset_cases", "shape_cases", "tflops", "VARLEN_SEED", "varlen_cases", "varlen_seqlens",
    # peers
    "IMPLS", "TORCH_BACKENDS", "VARLEN_IMPLS", "CupyStandard", "Impl", "NumbaFlash", "TorchSDPA", "causal_bias",
    "cupy_attention_backward", "cupy_attention_forward", "make_impls",
    # report
    "ROW_KEYS", "SCHEMA", "STATUSES", "BenchResult", "add_derived", "csv_text", "plot",
    "rows_from_json", "to_json_dict", "write_csv", "write_json",
    # run
    "measure", "run_bench",
    # timing
    "DEFAULT_L2_BYTES", "L2_FACTOR", "MAX_SETS", "InputSet", "NoDeviceError", "Timing",
    "free_bytes", "is_oom", "l2_bytes", "release_memory", "require_device", "rotation_count",
    "time_fn",
]  # fmt: skip
# _short and _pyplot stay importable from here too: numba_flash.memory uses them
