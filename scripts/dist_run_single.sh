#!/usr/bin/env bash
# Distributed training on one node: NGPUS processes through torchrun, one per GPU.
# Without GPUs the processes run on the CPU with gloo, so the same command works on a laptop.
#   usage: scripts/dist_run_single.sh NGPUS SCRIPT CFG [MODEL_DIR] [extra script args...]
#   MODEL_DIR defaults to ./ ; e.g. scripts/dist_run_single.sh 4 vcr/train_end2end.py cfgs/vcr/x.yaml ./ --opts TRAIN.LR 1e-4
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/launch_common.sh"
usage_check 3 "NGPUS SCRIPT CFG [MODEL_DIR] [extra args...]" "$@"

NGPUS=$1 SCRIPT=$2 CFG=$3
shift 3
MODEL_DIR=./
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then   # a 4th argument not starting with '-' is MODEL_DIR
    MODEL_DIR=$1
    shift
fi
# --standalone: a local rendezvous on a free port, so several jobs can share the node.
exec "$PYTHON" "$(dirname "${BASH_SOURCE[0]}")/torchrun.py" --standalone --nnodes=1 --nproc_per_node="$NGPUS" \
    "$SCRIPT" --cfg "$CFG" --model-dir "$MODEL_DIR" --dist "$@"
