#!/usr/bin/env bash
# Every CUDA figure of the project in one run of at most 6 minutes (see docs/gpu_suite.md):
#
#   bench/gpu_suite.sh [--dry-run] [--only STEP[,STEP]] [--out DIR] [--jobs N] [--budget S] [--list]
#
# First installs the wheels carried in .whl/ (python bench/gpu_wheels.py download makes them) whose packages
# this Python lacks, into /tmp/site (put on PYTHONPATH), then runs the steps of bench/gpu_suite.py. Results:
# DIR/gpu_suite.md and DIR/gpu_suite.json (DIR: --out, else $OUT when set, else bench_out/). Exit code 0 when
# every step is ok or skip, 1 when one failed, 2 for bad arguments or a failed wheel install.
set -euo pipefail
cd "$(dirname "$0")/.."

# The project's virtualenv when there is one (this machine), else the machine's Python (the GPU machine).
PYTHON=${PYTHON:-}
if [ -z "$PYTHON" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=$(command -v python3 || command -v python); fi
fi
SITE=${GPU_SUITE_SITE:-/tmp/site}

if compgen -G ".whl/*.whl" > /dev/null; then
    if ! "$PYTHON" bench/gpu_wheels.py install --target "$SITE" > /dev/null; then
        echo "error: installing the wheels of .whl/ into $SITE failed (see above)" >&2
        exit 2
    fi
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
exec "$PYTHON" bench/gpu_suite.py "$@"
