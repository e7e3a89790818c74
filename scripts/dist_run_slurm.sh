#!/usr/bin/env bash
# Distributed training under SLURM: srun starts NTASKS tasks (TASKS_PER_NODE per node), one per GPU, or
# on the CPU where the partition has none; each task reads its rank from SLURM variables (--slurm). A
# task that fails ends the whole job. Run it inside an allocation (sbatch, salloc) or from a login node.
#   usage: scripts/dist_run_slurm.sh PARTITION JOB SCRIPT CFG WORK_DIR [NTASKS] [extra script args...]
#   NTASKS: default the allocation's SLURM_NTASKS, else 8
#   environment: GPUS_PER_NODE (tasks per node; default NTASKS / the allocation's nodes, else min(8, NTASKS)),
#                CPUS_PER_TASK (default the allocation's SLURM_CPUS_PER_TASK, else 5),
#                GRES (default gpu:GPUS_PER_NODE when `sinfo -p PARTITION` lists GPUs, else none;
#                      'none' asks for none), OMP_NUM_THREADS (default 1 per task, as torchrun),
#                SRUN_ARGS (extra srun flags), PY_ARGS (extra script flags),
#                MASTER_PORT (default 20000 + SLURM_JOB_ID % 10000; the log names the port),
#                STEP_END_S (default 60: how long srun may take to end the step once a task failed)
# Preemption: on SIGTERM or SIGUSR1 every rank stops at the next optimizer step, saves a checkpoint and
# exits with code 75 (common/runtime/preemption.py). The launcher then requeues the job (scontrol requeue), unless
# SLURM has requeued it already (scontrol requeue, preemption) or it was cancelled (scancel JOBID), and
# TRAIN.AUTO_RESUME continues from that checkpoint. A SIGUSR1 sent to this shell (sbatch --signal=B:USR1@120)
# is passed on to the tasks; a SIGTERM is not (SLURM sends it to the tasks itself). Exec the launcher from the
# job script, so that it is the batch shell (docs/slurm.md):
#   sbatch --requeue --signal=B:USR1@120 --nodes=1 --ntasks=8 --cpus-per-task=5 --gres=gpu:8 --wrap \
#     "exec scripts/dist_run_slurm.sh PARTITION JOB vcr/train_end2end.py CFG WORK_DIR 8 --opts TRAIN.AUTO_RESUME true"
# Exit codes: 75 = checkpoint saved (requeued inside a job); 128 + N = signal N arrived twice, or no step
# ended within 60 s of it (no new checkpoint; the previous ones are intact); 2 = bad usage or input.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/launch_common.sh"
usage_check 5 "PARTITION JOB SCRIPT CFG WORK_DIR [NTASKS] [extra script args...]" "$@"

PARTITION=$1 JOB_NAME=$2 SCRIPT=$3 CFG=$4 WORK_DIR=$5 NTASKS=${6:-${SLURM_NTASKS:-8}}
shift $(($# < 6 ? $# : 6))
PREEMPTED_EXIT_CODE=75  # common.runtime.preemption.PREEMPTED_EXIT_CODE
# Tasks per node: inside an allocation NTASKS spread over its nodes (SLURM_JOB_NUM_NODES), else up to 8.
if [ -n "${SLURM_JOB_NUM_NODES:-}" ]; then
    GPUS_PER_NODE=${GPUS_PER_NODE:-$(((NTASKS + SLURM_JOB_NUM_NODES - 1) / SLURM_JOB_NUM_NODES))}
fi
GPUS_PER_NODE=${GPUS_PER_NODE:-$((NTASKS < 8 ? NTASKS : 8))}
CPUS_PER_TASK=${CPUS_PER_TASK:-${SLURM_CPUS_PER_TASK:-5}}
if [ -z "${GRES+set}" ]; then
    GRES=none
    if sinfo -h -p "$PARTITION" -o %G 2>/dev/null | grep -q gpu; then GRES=gpu:$GPUS_PER_NODE; fi
fi
GRES_ARG=()
[ "$GRES" = none ] || [ -z "$GRES" ] || GRES_ARG=(--gres="$GRES")
# srun learns that a task ended from its node: with that node cut off (a link down) it waits for ever, even after
# every other task failed. STEP_END_S s after the first failed task, the launcher ends srun and so the job.
STEP_END_S=${STEP_END_S:-60}
if ! [[ "$STEP_END_S" =~ ^[0-9]+$ ]]; then
    echo "error: STEP_END_S must be a whole number of seconds, got '$STEP_END_S'" >&2
    exit 2
fi
# More threads per task than its CPUs slow every step (and change the bits of a CPU run).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

# Each task records its exit code here (a folder of WORK_DIR, which every node sees). A rank exits 75 only
# once the checkpoint is on disk, so one 75 means "preempted", even when srun killed a slower rank. The
# task then reports 0 to srun, so that --kill-on-bad-exit lets the other ranks end on their own. A failed
# job exits with the code of its first failed task (srun's own is 137 when it killed the others).
mkdir -p "$WORK_DIR"
EXIT_CODES=$(mktemp -d "$WORK_DIR/.exit-codes.XXXXXX")
# A user mistake (exit code 2): each task writes its error lines here instead of printing them, and the
# launcher prints each distinct message once (common/runtime/rank_errors.py).
VLBERT_RANK_ERRORS=$(mktemp -d "$WORK_DIR/.rank-errors.XXXXXX")
trap 'rm -rf "$EXIT_CODES" "$VLBERT_RANK_ERRORS"' EXIT
export VLBERT_RANK_ERRORS
# The task's shell outlives the signals SLURM sends to every process of the step (its trap runs once the
# script has ended). Python starts with SIGUSR1 ignored, which would otherwise kill it before training
# installs its handler (common/runtime/preemption.py): an early warning signal is dropped, the time limit's
# SIGTERM still stops the run.
TASK='trap : TERM; trap "" USR1; "$@"; rc=$?; echo $rc > "$EXIT_CODES/$SLURM_PROCID"; [ $rc -eq 75 ] && rc=0; exit $rc'
export EXIT_CODES
SRUN_PID=
trap 'echo "SIGUSR1: passed on to the tasks" >&2; [ -z "$SRUN_PID" ] || kill -USR1 "$SRUN_PID"' USR1
trap 'echo "SIGTERM: waiting for the tasks (SLURM signals them itself)" >&2' TERM
# shellcheck disable=SC2086  # SRUN_ARGS and PY_ARGS are word lists
srun -p "$PARTITION" --job-name="$JOB_NAME" "${GRES_ARG[@]}" --ntasks="$NTASKS" \
    --ntasks-per-node="$GPUS_PER_NODE" --cpus-per-task="$CPUS_PER_TASK" --kill-on-bad-exit=1 ${SRUN_ARGS:-} \
    bash -c "$TASK" task "$PYTHON" -u "$SCRIPT" --cfg "$CFG" --model-dir "$WORK_DIR" --slurm --dist ${PY_ARGS:-} \
    "$@" &
SRUN_PID=$!
(
    waited=0
    while kill -0 "$SRUN_PID" 2>/dev/null; do
        if grep -qvxE "0|$PREEMPTED_EXIT_CODE" "$EXIT_CODES"/* 2>/dev/null; then waited=$((waited + 1)); fi
        if [ "$waited" -gt "$STEP_END_S" ]; then
            echo "error: srun has not ended the step $STEP_END_S s after a task failed (a node cut off?): ending it" >&2
            kill -KILL "$SRUN_PID"
            exit 0
        fi
        sleep 1
    done
) &
WATCHDOG_PID=$!
while :; do
    wait "$SRUN_PID" && rc=0 || rc=$?
    kill -0 "$SRUN_PID" 2>/dev/null || break  # else a trapped signal interrupted the wait
done
trap - USR1 TERM
kill "$WATCHDOG_PID" 2>/dev/null || true
declare -A said
for file in "$VLBERT_RANK_ERRORS"/*; do
    [ -s "$file" ] || continue
    text=$(cat "$file")
    [ -n "${said[$text]:-}" ] || echo "$text" >&2
    said[$text]=1
done
if grep -qx "$PREEMPTED_EXIT_CODE" "$EXIT_CODES"/* 2>/dev/null; then
    rc=$PREEMPTED_EXIT_CODE
elif [ "$rc" -ne 0 ]; then
    # the code of the task that failed first (those srun killed then recorded none), e.g. 2 for bad input
    for task in $(cd "$EXIT_CODES" && ls -tr); do
        code=$(cat "$EXIT_CODES/$task")
        if [ "$code" -ne 0 ]; then rc=$code; break; fi
    done
fi
if [ "$rc" -eq "$PREEMPTED_EXIT_CODE" ] && [ -n "${SLURM_JOB_ID:-}" ]; then
    job=$(scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null || true)
    restarts=$(echo "$job" | grep -o 'Restarts=[0-9]*' | cut -d= -f2 || true)
    if [ "${restarts:-0}" -gt "${SLURM_RESTART_COUNT:-0}" ]; then
        echo "preempted: checkpoint saved; SLURM has requeued job $SLURM_JOB_ID already" >&2
    elif echo "$job" | grep -q 'JobState=CANCELLED\|JobState=COMPLETING .*Reason=None '; then
        # scancel JOBID: the job ends (COMPLETING) without a reason; a time limit gives Reason=TimeLimit
        echo "stopped: checkpoint saved; job $SLURM_JOB_ID was cancelled (scancel), so it is not requeued" >&2
    else
        echo "preempted: checkpoint saved; requeueing job $SLURM_JOB_ID" >&2
        scontrol requeue "$SLURM_JOB_ID"
    fi
fi
exit "$rc"
