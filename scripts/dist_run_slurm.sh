#!/usr/bin/env bash
# Distributed training under SLURM: srun starts GPUS tasks (GPUS_PER_NODE per node); each task
# reads its rank from SLURM variables (--slurm). A task that fails ends the whole job.
#   usage: scripts/dist_run_slurm.sh PARTITION JOB SCRIPT CFG WORK_DIR [GPUS (default 8)]
#   environment: GPUS_PER_NODE (8), CPUS_PER_TASK (5), SRUN_ARGS (extra srun flags),
#                PY_ARGS (extra script flags), MASTER_PORT (default 20000 + SLURM_JOB_ID % 10000, so
#                that jobs sharing a node differ; the log names the port)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/launch_common.sh"
usage_check 5 "PARTITION JOB SCRIPT CFG WORK_DIR [GPUS]" "$@"

PARTITION=$1 JOB_NAME=$2 SCRIPT=$3 CFG=$4 WORK_DIR=$5 GPUS=${6:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
# shellcheck disable=SC2086  # SRUN_ARGS and PY_ARGS are word lists
exec srun -p "$PARTITION" --job-name="$JOB_NAME" --gres=gpu:"$GPUS_PER_NODE" --ntasks="$GPUS" \
    --ntasks-per-node="$GPUS_PER_NODE" --cpus-per-task="$CPUS_PER_TASK" --kill-on-bad-exit=1 ${SRUN_ARGS:-} \
    "$PYTHON" -u "$SCRIPT" --cfg "$CFG" --model-dir "$WORK_DIR" --slurm --dist ${PY_ARGS:-}
