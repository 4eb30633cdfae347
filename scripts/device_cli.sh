# Sourced by the device scripts: the `numba-flash` console script on a machine where the
# package is not installed (cli/ is importable as numba_flash_cli through a link).
mkdir -p /tmp/clipkg /tmp/bin && ln -sfn "$PWD/cli" /tmp/clipkg/numba_flash_cli
printf '#!/bin/sh\nexec python3 -c "from numba_flash_cli.main import main; main()" "$@"\n' > /tmp/bin/numba-flash
chmod +x /tmp/bin/numba-flash
export PATH=/tmp/bin:$PATH PYTHONPATH=$PYTHONPATH:/tmp/clipkg
