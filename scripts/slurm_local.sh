#!/usr/bin/env bash
# A SLURM cluster on this machine, for trying the SLURM launcher (and for its slow tests): one node, or
# N nodes in network namespaces.
#   usage: scripts/slurm_local.sh start [--nodes N] | stop | status
#   environment: SLURM_LOCAL_DIR (state, logs and slurm.conf; default /tmp/slurm_local),
#                SLURM_LOCAL_CPUS (CPUs each node offers; default nproc)
# start installs Debian's slurm-wlm and munge when missing (apt-get, as root), writes
# $SLURM_LOCAL_DIR/slurm.conf (proctrack/linuxproc, select/cons_tres, JobRequeue=1, one partition
# "debug"), starts munged, slurmctld -D and slurmd -D in the background (no systemd needed), records their
# PIDs and waits until every node is idle. Then, in the same shell:
#   export SLURM_CONF=$SLURM_LOCAL_DIR/slurm.conf; sinfo; sbatch ...
# --nodes 1 (the default): one node, this host at 127.0.0.1. --nodes N (N >= 2): nodes node0..node{N-1}, each a
# network namespace slurm_nodeI with its own hostname (a UTS namespace) and address 10.213.0.(10+I) on a
# private bridge slurmbr0 (10.213.0.1, where slurmctld listens), named in /etc/hosts; one slurmd per node,
# entered with nsenter (not `ip netns exec`, which remounts /sys and breaks slurmd's cgroup set-up), munged's
# unix socket shared. Traffic stays on the bridge.
# stop ends the daemons by their recorded PIDs, then for N nodes every process left in the namespaces, the
# namespaces, the bridge and the /etc/hosts lines it added. Exit code 2: bad usage; 1: the cluster did not
# come up, or the namespaces cannot be made here (the reason and the daemons' last log lines are printed).
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

# the private network of --nodes N (N >= 2); nothing outside this machine is reached
BRIDGE=slurmbr0 SUBNET=10.213.0 NETNS_PREFIX=slurm_node HOSTS_TAG="# slurm_local.sh"

node_lines() {
    if [ "$NODES" -eq 1 ]; then
        echo "NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS State=UNKNOWN"
        echo "PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP"
        return
    fi
    for i in $(seq 0 $((NODES - 1))); do
        echo "NodeName=node$i NodeAddr=$SUBNET.$((10 + i)) CPUs=$CPUS State=UNKNOWN"
    done
    echo "PartitionName=debug Nodes=node[0-$((NODES - 1))] Default=YES MaxTime=INFINITE State=UP"
}

write_conf() {
    mkdir -p "$DIR/state" "$DIR/spool" "$DIR/munge"
    local ctl=$HOST
    [ "$NODES" -eq 1 ] || ctl="$HOST($SUBNET.1)"
    cat >"$CONF" <<EOF
# Written by scripts/slurm_local.sh: $NODES node(s), one partition.
ClusterName=local
SlurmctldHost=$ctl
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$DIR/state
# %n: each node its own spool, pid and log file (the nodes share this folder)
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd-%n.log
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
$(node_lines)
EOF
}

# Make the bridge, one namespace per node and their /etc/hosts lines; each step is recorded in $DIR/made
# first, so that stop undoes exactly what was made, even after a failure half-way.
make_network() {
    local why
    if ! why=$(ip link add "$BRIDGE" type bridge 2>&1); then
        echo "error: cannot make the bridge $BRIDGE for $NODES nodes: ${why:-ip link add failed}" >&2
        return 1
    fi
    echo "bridge $BRIDGE" >>"$DIR/made"
    ip addr add "$SUBNET.1/24" dev "$BRIDGE" && ip link set "$BRIDGE" up
    for i in $(seq 0 $((NODES - 1))); do
        local ns=$NETNS_PREFIX$i
        if ! why=$(ip netns add "$ns" 2>&1); then
            echo "error: cannot make the network namespace $ns: ${why:-ip netns add failed}" >&2
            return 1
        fi
        echo "netns $ns" >>"$DIR/made"
        ip link add "slveth$i" type veth peer name eth0 netns "$ns"
        ip link set "slveth$i" master "$BRIDGE" up
        ip -n "$ns" addr add "$SUBNET.$((10 + i))/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
    done
    echo "hosts" >>"$DIR/made"
    for i in $(seq 0 $((NODES - 1))); do echo "$SUBNET.$((10 + i)) node$i $HOSTS_TAG"; done >>/etc/hosts
}

remove_network() {
    [ -f "$DIR/made" ] || return 0
    tac "$DIR/made" | while read -r what name; do
        case $what in
            hosts)  # /etc/hosts may be a bind mount: rewrite it in place, never replace the file
                grep -vF "$HOSTS_TAG" /etc/hosts >"$DIR/hosts.tmp" || true
                cat "$DIR/hosts.tmp" >/etc/hosts && rm -f "$DIR/hosts.tmp" ;;
            netns)  # job processes that outlived their slurmd keep a namespace alive
                for pid in $(ip netns pids "$name" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
                # the veth pair goes synchronously with its root side (with the namespace it goes later)
                ip link del "slveth${name#"$NETNS_PREFIX"}" 2>/dev/null || true
                ip netns del "$name" 2>/dev/null || true ;;
            bridge) ip link del "$name" 2>/dev/null || true ;;
        esac
    done
    rm -f "$DIR/made"
}

running() {
    [ -f "$DIR/pids" ] && while read -r name pid; do kill -0 "$pid" 2>/dev/null || return 1; done <"$DIR/pids"
}

start() {
    mkdir -p "$DIR"
    if running; then echo "already running: $(cat "$DIR/nodes") node(s) (SLURM_CONF=$CONF)"; return; fi
    install_missing
    if [ "$NODES" -gt 1 ]; then
        for tool in ip nsenter unshare; do
            command -v $tool >/dev/null || { echo "error: $NODES nodes need '$tool' (iproute2, util-linux)" >&2; exit 1; }
        done
        remove_network
        make_network || { remove_network; exit 1; }
    fi
    write_conf
    echo "$NODES" >"$DIR/nodes"
    : >"$DIR/pids"
    mkdir -p /run/munge && chown munge:munge /run/munge 2>/dev/null || true
    munged -F --force --socket=/run/munge/munge.socket.2 >"$DIR/munged.log" 2>&1 &
    echo "munged $!" >>"$DIR/pids"
    sleep 1
    SLURM_CONF=$CONF slurmctld -D -i -f "$CONF" >>"$DIR/slurmctld.out" 2>&1 &
    echo "slurmctld $!" >>"$DIR/pids"
    if [ "$NODES" -eq 1 ]; then
        SLURM_CONF=$CONF slurmd -D -f "$CONF" >>"$DIR/slurmd.out" 2>&1 &
        echo "slurmd $!" >>"$DIR/pids"
    else
        for i in $(seq 0 $((NODES - 1))); do
            # nsenter and unshare exec: $! is slurmd's PID; its tasks inherit the hostname node$i
            SLURM_CONF=$CONF nsenter --net="/run/netns/$NETNS_PREFIX$i" unshare --uts \
                sh -c "hostname node$i && exec slurmd -D -N node$i -f '$CONF'" >>"$DIR/slurmd-node$i.out" 2>&1 &
            echo "slurmd $!" >>"$DIR/pids"
        done
    fi
    for _ in $(seq 60); do
        if [ "$(SLURM_CONF=$CONF sinfo -h -N -o %t 2>/dev/null | grep -cx "idle\|mix\|alloc")" -eq "$NODES" ]; then
            echo "SLURM is up: $NODES node(s) of $CPUS CPU(s), partition debug; export SLURM_CONF=$CONF"
            return
        fi
        sleep 1
    done
    echo "error: the $NODES node(s) did not become idle within 60 s (logs in $DIR)" >&2
    tail -n 5 "$DIR"/slurmctld.log "$DIR"/slurmd*.log "$DIR"/munged.log >&2 || true
    stop
    exit 1
}

stop() {
    if [ -f "$DIR/pids" ]; then
        # slurmd and slurmctld before munged, which they authenticate through
        tac "$DIR/pids" | while read -r name pid; do
            kill "$pid" 2>/dev/null || continue
            for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
            kill -9 "$pid" 2>/dev/null || true
        done
        rm -f "$DIR/pids"
    fi
    remove_network
    echo "stopped"
}

NODES=1
case "${1:-}" in
    start)
        if [ $# -eq 3 ] && [ "$2" = --nodes ] && [[ "$3" =~ ^[1-9][0-9]?$ ]] && [ "$3" -le 50 ]; then NODES=$3
        elif [ $# -ne 1 ]; then echo "error: start takes --nodes N (N in 1..50), got: ${*:2}" >&2; exit 2; fi
        start ;;
    stop) stop ;;
    status) if running; then echo "running: $(cat "$DIR/nodes") node(s) (SLURM_CONF=$CONF)"; else echo "not running"; exit 1; fi ;;
    *) echo "usage: $(basename "$0") start [--nodes N] | stop | status" >&2; exit 2 ;;
esac
