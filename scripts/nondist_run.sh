#!/usr/bin/env bash
# Training in one process (one GPU, or the CPU).
#   usage: scripts/nondist_run.sh SCRIPT CFG MODEL_DIR [extra script args...]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/launch_common.sh"
usage_check 3 "SCRIPT CFG MODEL_DIR [extra args...]" "$@"

SCRIPT=$1 CFG=$2 MODEL_DIR=$3
shift 3
exec "$PYTHON" "$SCRIPT" --cfg "$CFG" --model-dir "$MODEL_DIR" "$@"
