#!/usr/bin/env bash
# A real one-node Slurm cluster on this machine, for `make test-slurm` and for trying
# `meds ablate --launcher slurm` before a real cluster: Slurm 22.05 and munge from the Debian
# registry, one node (this host, all its CPUs), SlurmUser=root, no cgroups.
#
#   bash scripts/slurm_local.sh start    # install (once), configure (once), start the daemons
#   bash scripts/slurm_local.sh status   # which daemons run, and sinfo
#   bash scripts/slurm_local.sh stop     # stop the daemons this script started (by their pid files)
#
# Idempotent: start on a running cluster only says so; stop on a stopped one too. It writes
# /etc/slurm/slurm.conf and /etc/munge/munge.key only where they do not exist yet (a machine
# with its own Slurm keeps its own). Partitions: `debug` (default, no time limit) and `short`
# (10 minutes at most), so that time limits can be tested against a real partition.
set -euo pipefail

CONF=/etc/slurm/slurm.conf
KEY=/etc/munge/munge.key
MUNGE_PID=/run/munge/munged.pid
CTLD_PID=/run/slurmctld.pid
SLURMD_PID=/run/slurmd.pid
say() { echo "slurm_local: $*"; }
die() { echo "slurm_local: $*" >&2; exit 1; }

running() {  # pid file -> true when the process it names is alive
    [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

need_root() {
    [[ $(id -u) -eq 0 ]] || die "must run as root (it installs packages and starts daemons): sudo bash $0 $1; \
without root, run grids with --launcher local"
}

install_packages() {
    if command -v sbatch >/dev/null && command -v slurmctld >/dev/null && command -v munged >/dev/null; then
        say "slurm-wlm and munge are installed (slurm-wlm $(dpkg-query -W -f='${Version}' slurm-wlm 2>/dev/null || echo "?"))"
        return
    fi
    command -v apt-get >/dev/null || die "no apt-get here: install slurm-wlm and munge with this system's package manager"
    say "installing slurm-wlm and munge (apt-get) ..."
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
    say "installed slurm-wlm $(dpkg-query -W -f='${Version}' slurm-wlm)"
}

write_config() {
    if [[ ! -f $KEY ]]; then
        mkdir -p /etc/munge
        dd if=/dev/urandom of=$KEY bs=1 count=1024 status=none
        say "wrote a new munge key $KEY"
    fi
    chown munge:munge $KEY && chmod 400 $KEY
    mkdir -p /run/munge /var/lib/munge /var/log/munge /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
    chown munge:munge /run/munge /var/lib/munge /var/log/munge
    if [[ -f $CONF ]]; then
        say "keeping the existing $CONF"
        return
    fi
    local host cpus memory
    host=$(hostname -s)
    cpus=$(nproc --all)
    memory=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 9 / 10 ))  # MB Slurm may hand out
    mkdir -p /etc/slurm
    cat > $CONF <<EOF
# Written by meds scripts/slurm_local.sh: a one-node cluster on this machine.
ClusterName=local
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$SLURMD_PID
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ReturnToService=2
MpiDefault=none
JobRequeue=1
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
PartitionName=short Nodes=$host MaxTime=00:10:00 State=UP
EOF
    say "wrote $CONF (node $host, $cpus CPUs, ${memory} MB; partitions debug and short)"
}

node_state() { sinfo -h -N -o %T 2>/dev/null | head -1; }

start() {
    need_root start
    install_packages
    write_config
    if running $MUNGE_PID; then say "munged already runs (pid $(cat $MUNGE_PID))"; else
        runuser -u munge -- munged
        say "started munged (pid $(cat $MUNGE_PID))"
    fi
    if running $CTLD_PID; then say "slurmctld already runs (pid $(cat $CTLD_PID))"; else
        slurmctld
        say "started slurmctld"
    fi
    if running $SLURMD_PID; then say "slurmd already runs (pid $(cat $SLURMD_PID))"; else
        slurmd
        say "started slurmd"
    fi
    local state=""
    for _ in $(seq 60); do
        state=$(node_state)
        case $state in
            idle*|mixed*|allocated*) say "node $(hostname -s) is $state"; sinfo; return ;;
            down*|drain*) scontrol update nodename="$(hostname -s)" state=resume 2>/dev/null || true ;;
        esac
        sleep 1
    done
    die "the node did not become idle within 60 s (state: ${state:-unknown}); see /var/log/slurm/*.log"
}

stop_one() {  # name, pid file
    if ! running "$2"; then say "$1 is not running"; return; fi
    local pid
    pid=$(cat "$2")
    kill "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid"; fi
    say "stopped $1 (pid $pid)"
}

stop() {
    need_root stop
    stop_one slurmd $SLURMD_PID
    stop_one slurmctld $CTLD_PID
    stop_one munged $MUNGE_PID
}

status() {
    for pair in "munged:$MUNGE_PID" "slurmctld:$CTLD_PID" "slurmd:$SLURMD_PID"; do
        if running "${pair#*:}"; then say "${pair%%:*} runs (pid $(cat "${pair#*:}"))"; else say "${pair%%:*} is not running"; fi
    done
    if running $CTLD_PID; then sinfo; fi
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) die "usage: bash $0 start|stop|status" ;;
esac
