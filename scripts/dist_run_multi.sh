#!/usr/bin/env bash
# Distributed training over several nodes: run once on every node, NODE_RANK 0..NNODES-1.
# MASTER_ADDR is node 0's address; set MASTER_PORT to change the port (default 29500).
#   usage: scripts/dist_run_multi.sh NNODES NODE_RANK MASTER_ADDR NGPUS SCRIPT CFG MODEL_DIR [extra args...]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/launch_common.sh"
usage_check 7 "NNODES NODE_RANK MASTER_ADDR NGPUS SCRIPT CFG MODEL_DIR [extra args...]" "$@"

NNODES=$1 NODE_RANK=$2 ADDR=$3 NGPUS=$4 SCRIPT=$5 CFG=$6 MODEL_DIR=$7
shift 7
exec "$PYTHON" "$(dirname "${BASH_SOURCE[0]}")/torchrun.py" --nnodes="$NNODES" --node_rank="$NODE_RANK" \
    --master_addr="$ADDR" --master_port="${MASTER_PORT:-29500}" --nproc_per_node="$NGPUS" \
    "$SCRIPT" --cfg "$CFG" --model-dir "$MODEL_DIR" --dist "$@"
