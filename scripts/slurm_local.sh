#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for trying the SLURM launcher (and for its slow tests).
#   usage: scripts/slurm_local.sh start|stop|status
#   environment: SLURM_LOCAL_DIR (state, logs and slurm.conf; default /tmp/slurm_local),
#                SLURM_LOCAL_CPUS (CPUs the node offers; default nproc)
# start installs Debian's slurm-wlm and munge when missing (apt-get, as root), writes
# $SLURM_LOCAL_DIR/slurm.conf (proctrack/linuxproc, select/cons_tres, JobRequeue=1, one partition
# "debug" on this host), starts munged, slurmctld -D and slurmd -D in the background (no systemd
# needed), records their PIDs and waits until the node is idle. Then, in the same shell:
#   export SLURM_CONF=$SLURM_LOCAL_DIR/slurm.conf; sinfo; sbatch ...
# stop ends the daemons by their recorded PIDs. Exit code 2: bad usage; 1: the cluster did not come up
# (the last lines of the daemons' logs are printed).
set -euo pipefail
DIR=${SLURM_LOCAL_DIR:-/tmp/slurm_local}
CPUS=${SLURM_LOCAL_CPUS:-$(nproc)}
CONF=$DIR/slurm.conf
HOST=$(hostname -s)

install_missing() {
    command -v slurmctld >/dev/null && command -v munged >/dev/null && return
    echo "installing slurm-wlm and munge (apt-get)" >&2
    export DEBIAN_FRONTEND=noninteractive
    # the package lists may be missing or stale; another apt-get may hold the lock: retry for 5 min
    for _ in $(seq 60); do
        if apt-get install -y --no-install-recommends slurm-wlm munge >"$DIR/apt.log" 2>&1; then return; fi
        grep -q "Unable to locate\|has no installation candidate" "$DIR/apt.log" && apt-get update >>"$DIR/apt.log" 2>&1
        sleep 5
    done
    echo "error: apt-get install slurm-wlm munge failed (see $DIR/apt.log)" >&2
    exit 1
}

write_conf() {
    mkdir -p "$DIR/state" "$DIR/spool" "$DIR/munge"
    cat >"$CONF" <<EOF
# Written by scripts/slurm_local.sh: one node ($HOST), one partition.
ClusterName=local
SlurmctldHost=$HOST
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# The node's CPUs come from this file, not from the hardware (SLURM_LOCAL_CPUS may exceed nproc).
SlurmdParameters=config_overrides
JobRequeue=1
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# Seconds between SIGTERM and SIGKILL when a job ends (cancel, requeue, time limit).
KillWait=30
# Finished jobs stay visible to scontrol for 10 min.
MinJobAge=600
SchedulerParameters=defer_batch=0
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
}

running() {
    [ -f "$DIR/pids" ] && while read -r name pid; do kill -0 "$pid" 2>/dev/null || return 1; done <"$DIR/pids"
}

start() {
    mkdir -p "$DIR"
    if running; then echo "already running (SLURM_CONF=$CONF)"; return; fi
    install_missing
    write_conf
    : >"$DIR/pids"
    mkdir -p /run/munge && chown munge:munge /run/munge 2>/dev/null || true
    munged -F --force --socket=/run/munge/munge.socket.2 >"$DIR/munged.log" 2>&1 &
    echo "munged $!" >>"$DIR/pids"
    sleep 1
    SLURM_CONF=$CONF slurmctld -D -i -f "$CONF" >>"$DIR/slurmctld.out" 2>&1 &
    echo "slurmctld $!" >>"$DIR/pids"
    SLURM_CONF=$CONF slurmd -D -f "$CONF" >>"$DIR/slurmd.out" 2>&1 &
    echo "slurmd $!" >>"$DIR/pids"
    for _ in $(seq 60); do
        if SLURM_CONF=$CONF sinfo -h -o %t 2>/dev/null | grep -qx "idle\|mix\|alloc"; then
            echo "SLURM is up: $CPUS CPU(s) on $HOST, partition debug; export SLURM_CONF=$CONF"
            return
        fi
        sleep 1
    done
    echo "error: the node did not become idle within 60 s (logs in $DIR)" >&2
    tail -n 5 "$DIR"/slurmctld.log "$DIR"/slurmd.log "$DIR"/munged.log >&2 || true
    stop
    exit 1
}

stop() {
    [ -f "$DIR/pids" ] || return 0
    # slurmd and slurmctld before munged, which they authenticate through
    tac "$DIR/pids" | while read -r name pid; do
        kill "$pid" 2>/dev/null || continue
        for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill -9 "$pid" 2>/dev/null || true
    done
    rm -f "$DIR/pids"
    echo "stopped"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) if running; then echo "running (SLURM_CONF=$CONF)"; else echo "not running"; exit 1; fi ;;
    *) echo "usage: $(basename "$0") start|stop|status" >&2; exit 2 ;;
esac
