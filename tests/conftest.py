"""Test-suite setup: the CUDA simulator on machines without a GPU.

The same test code runs the kernels in numba's CUDA simulator on a CPU-only machine
(tiny shapes; CI does this) and on a real GPU, where tests marked ``gpu`` add the
real sizes.  The choice has to be made before numba is imported.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from numba_flash._gpu_probe import use_simulator_without_gpu  # noqa: E402

SIMULATOR = use_simulator_without_gpu()

import pytest  # noqa: E402


def pytest_report_header(config):
    return "numba-flash kernels run in: " + ("the CUDA simulator (no GPU)" if SIMULATOR else "a CUDA GPU")


def pytest_collection_modifyitems(config, items):
    if not SIMULATOR:
        return
    skip = pytest.mark.skip(reason="real-size GPU case: needs a CUDA device (the CUDA simulator is on here)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
