#!/usr/bin/env bash
# Training in one process (one GPU, or the CPU).
#   usage: scripts/nondist_run.sh SCRIPT CFG MODEL_DIR [extra script args...]
set -euo pipefail
if [ $# -lt 3 ]; then
    echo "usage: $0 SCRIPT CFG MODEL_DIR [extra args...]" >&2
    exit 2
fi
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="$REPO/.venv/bin/python"
[ -x "$PYTHON" ] || PYTHON=python3

SCRIPT=$1 CFG=$2 MODEL_DIR=$3
shift 3
exec "$PYTHON" "$SCRIPT" --cfg "$CFG" --model-dir "$MODEL_DIR" "$@"
