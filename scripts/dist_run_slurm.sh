#!/usr/bin/env bash
# Distributed training under SLURM: srun starts GPUS tasks (GPUS_PER_NODE per node); each task
# reads its rank from SLURM variables (--slurm). A task that fails ends the whole job.
#   usage: scripts/dist_run_slurm.sh PARTITION JOB SCRIPT CFG WORK_DIR [GPUS (default 8)]
#   environment: GPUS_PER_NODE (8), CPUS_PER_TASK (5), SRUN_ARGS (extra srun flags),
#                PY_ARGS (extra script flags), MASTER_PORT (default 20000 + SLURM_JOB_ID % 10000, so
#                that jobs sharing a node differ; the log names the port)
# Preemption: on SIGTERM or SIGUSR1 every rank stops at the next optimizer step, saves a checkpoint and
# exits with code 75 (common/preemption.py). Inside an sbatch job this script then requeues the job
# (scontrol requeue), and TRAIN.AUTO_RESUME continues from that checkpoint:
#   sbatch --requeue --signal=USR1@120 --nodes=1 --gres=gpu:8 --wrap \
#     "scripts/dist_run_slurm.sh PARTITION JOB vcr/train_end2end.py CFG WORK_DIR 8 --opts TRAIN.AUTO_RESUME true"
# Exit codes: 75 = checkpoint saved, requeue; 128 + N = signal N arrived twice, or no step ended
# within 60 s of it (no new checkpoint; the previous ones are intact).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/launch_common.sh"
usage_check 5 "PARTITION JOB SCRIPT CFG WORK_DIR [GPUS] [extra script args...]" "$@"

PARTITION=$1 JOB_NAME=$2 SCRIPT=$3 CFG=$4 WORK_DIR=$5 GPUS=${6:-8}
shift $(($# < 6 ? $# : 6))
PREEMPTED_EXIT_CODE=75  # common.preemption.PREEMPTED_EXIT_CODE
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
rc=0
# shellcheck disable=SC2086  # SRUN_ARGS and PY_ARGS are word lists
srun -p "$PARTITION" --job-name="$JOB_NAME" --gres=gpu:"$GPUS_PER_NODE" --ntasks="$GPUS" \
    --ntasks-per-node="$GPUS_PER_NODE" --cpus-per-task="$CPUS_PER_TASK" --kill-on-bad-exit=1 ${SRUN_ARGS:-} \
    "$PYTHON" -u "$SCRIPT" --cfg "$CFG" --model-dir "$WORK_DIR" --slurm --dist ${PY_ARGS:-} "$@" || rc=$?
if [ "$rc" -eq "$PREEMPTED_EXIT_CODE" ] && [ -n "${SLURM_JOB_ID:-}" ]; then
    echo "preempted: checkpoint saved; requeueing job $SLURM_JOB_ID" >&2
    scontrol requeue "$SLURM_JOB_ID"
fi
exit "$rc"
