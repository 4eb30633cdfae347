"""The ``numba-flash`` command line (installed as the package ``numba_flash_cli``).

Thin by design: options are parsed and results formatted here; the work is done by
``numba_flash.check``, ``numba_flash.bench``, ``numba_flash.memory``,
``numba_flash.info`` and ``numba_flash.inspection``, all callable from Python.
"""
