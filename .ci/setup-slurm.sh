#!/usr/bin/env bash
# A real Slurm cluster on one machine, for srl's integration tests.
#
# Debian's slurm-wlm 22.05 supports several slurmd on one host: four `slurmd -N nodeN` processes listen on
# 127.0.0.1 with distinct ports, each node has 2 cores, 4000 MB and 4 fake GPUs (/dev/fakegpu0-3, clones of
# /dev/null, so GRES bookkeeping and CUDA_VISIBLE_DEVICES are real while no GPU exists). No accounting
# daemon: job records live in slurmctld for MinJobAge seconds.
#
# Usage (as root, or a user with passwordless sudo):
#   .ci/setup-slurm.sh [start]   install if missing, write config, start daemons, wait until 4 nodes respond.
#                                A no-op when the cluster is already up with the same config.
#   .ci/setup-slurm.sh stop      cancel every job, stop the daemons this layout owns (by PID file, checked).
#   .ci/setup-slurm.sh status    exit 0 when slurmctld answers and all 4 nodes respond, else 1.
# Environment: SRL_SLURM_WAIT_S (default 60) bounds every wait.
# Exit codes: 0 ok; 1 failure (message names the daemon and its log); 3 cannot install (not root, no apt, or
# installed but not on PATH).
set -euo pipefail

NODES=(node1 node2 node3 node4)
WAIT_S=${SRL_SLURM_WAIT_S:-60}
CONF_DIR=/etc/slurm
RUN_DIR=/run/slurm
SPOOL_CTLD=/var/spool/slurmctld
SPOOL_D=/var/spool/slurmd
LOG_DIR=/var/log/slurm
# Written when this script started munged, so `stop` leaves a munged it did not start alone.
MUNGE_OURS=$RUN_DIR/srl-started-munged
# Set by tests/slurm_cluster.py when a pytest session started the cluster; meaningless once restarted by hand.
TEST_OWNED=$RUN_DIR/srl-test-leases/OWNED

log() { printf '[setup-slurm] %s\n' "$*" >&2; }
die() { printf '[setup-slurm] ERROR: %s\n' "$*" >&2; exit 1; }

# `status` only reads; everything else installs packages or signals daemons.
if [[ $(id -u) -ne 0 && ${1:-start} != status ]]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
        exec sudo -n -E "$0" "$@"
    fi
    printf '[setup-slurm] ERROR: %s\n' "must run as root (or with passwordless sudo) to install and start slurm" >&2
    exit 3
fi

# ---- process helpers -------------------------------------------------------------------------------------
# PID 1 here reaps orphans late: a stopped daemon lingers as a zombie and `kill -0` still succeeds on it.
# A pid counts as alive only if /proc says it is not a zombie and its comm is the expected program, so a
# stale pid file can never make us signal an unrelated process.
pid_alive() {  # pid expected_comm
    local pid=$1 comm=$2 stat
    [[ -n $pid && -r /proc/$pid/comm ]] || return 1
    [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$comm" ]] || return 1
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
    stat=${stat##*) }          # fields after "(comm) "; the first is the state letter
    [[ ${stat%% *} != Z && ${stat%% *} != X ]]
}

pidfile_pid() { [[ -r $1 ]] && tr -dc '0-9' <"$1" || true; }

# Send TERM, wait up to 10 s, then KILL. Only for a pid that pid_alive accepted.
stop_pid() {  # pid comm
    local pid=$1 comm=$2 i
    pid_alive "$pid" "$comm" || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        pid_alive "$pid" "$comm" || return 0
        sleep 0.1
    done
    log "$comm (pid $pid) ignored SIGTERM for 10 s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
}

# Poll `cond` (a function name) every 0.1 s for at most $WAIT_S seconds.
wait_for() {  # cond
    local cond=$1 deadline=$((SECONDS + WAIT_S))
    until "$cond"; do
        ((SECONDS < deadline)) || return 1
        sleep 0.1
    done
}

# ---- install ---------------------------------------------------------------------------------------------
install_packages() {
    local missing=()
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v sbatch >/dev/null || missing+=(slurm-client)
    command -v munged >/dev/null || missing+=(munge)
    ((${#missing[@]})) || return 0
    # Installed but off this PATH: apt-get would change nothing and every later step would fail on a missing command.
    local pkg status
    for pkg in "${missing[@]}"; do
        status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null) || continue
        [[ $status != "install ok installed" ]] ||
            { log "ERROR: package $pkg is installed but its programs are not on PATH ($PATH)"; exit 3; }
    done
    command -v apt-get >/dev/null || { log "ERROR: ${missing[*]} missing and no apt-get to install them"; exit 3; }
    log "installing ${missing[*]} (apt)"
    export DEBIAN_FRONTEND=noninteractive
    # Postinst scripts try to start the daemons; with policy-rc.d denying that, they print a harmless notice.
    if ! apt-get install -y --no-install-recommends "${missing[@]}" >/tmp/setup-slurm-apt.log 2>&1; then
        apt-get update >>/tmp/setup-slurm-apt.log 2>&1 || true
        apt-get install -y --no-install-recommends "${missing[@]}" >>/tmp/setup-slurm-apt.log 2>&1 ||
            { tail -20 /tmp/setup-slurm-apt.log >&2; log "ERROR: apt-get install ${missing[*]} failed (log: /tmp/setup-slurm-apt.log)"; exit 3; }
    fi
}

# ---- config ----------------------------------------------------------------------------------------------
# Keep backticks and command substitutions out of these texts: they are literal config, and the quoted heredoc
# below would write them into slurm.conf unexpanded.
slurm_conf() {
    cat <<'EOF'
# Written by srl .ci/setup-slurm.sh: a 4-node test cluster on 127.0.0.1. Edits are overwritten.
ClusterName=localcluster
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# A requeued job waits cred_expire seconds before it may start again (120 s by default).
AuthInfo=cred_expire=10
CryptoType=crypto/munge
MpiDefault=none
# pgid: orphans of a job step are killed with it (linuxproc lets them escape).
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=/var/log/slurm/jobcomp.log
SchedulerType=sched/backfill
# Start batch jobs at once and rerun the scheduler every 2 s (requeued jobs otherwise wait for a 30-60 s pass).
SchedulerParameters=batch_sched_delay=0,sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
MailProg=/bin/true
# Fake nodes declare more CPUs and memory than the host has.
SlurmdParameters=config_overrides
# Without accounting, finished jobs are visible to scontrol and squeue only for MinJobAge seconds.
MinJobAge=600
KillWait=5
InactiveLimit=0
SlurmctldPort=6817
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd-%n.pid
SlurmdSpoolDir=/var/spool/slurmd/%n
StateSaveLocation=/var/spool/slurmctld
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
NodeName=node[1-4] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[17001-17004] Sockets=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=4000 Gres=gpu:4 State=UNKNOWN
# "preemptible": the same nodes at a lower priority tier; a debug job that needs their cores requeues its jobs
# (elastic inference replicas are tested on it).
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=2
PartitionName=preemptible Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE
EOF
}

gres_conf() {
    cat <<'EOF'
# Written by srl .ci/setup-slurm.sh. GPUs need File= entries; these are character devices cloned from /dev/null.
AutoDetect=off
NodeName=node[1-4] Name=gpu File=/dev/fakegpu[0-3]
EOF
}

cgroup_conf() {
    # Parsed strictly (an unknown key is fatal). Kept for hosts where autodetection needs the hint.
    cat <<'EOF'
CgroupPlugin=autodetect
IgnoreSystemd=yes
EOF
}

# Print "changed" if any config file differs from what we would write, after writing it when $1 == write.
sync_conf() {  # check|write
    local mode=$1 changed=0 name
    for name in slurm gres cgroup; do
        local want path=$CONF_DIR/$name.conf
        want=$("${name}_conf")
        if [[ ! -f $path || $(cat "$path") != "$want" ]]; then
            changed=1
            if [[ $mode == write ]]; then
                mkdir -p "$CONF_DIR"
                printf '%s\n' "$want" >"$path.tmp.$$" && mv "$path.tmp.$$" "$path"
            fi
        fi
    done
    ((changed)) && echo changed || true
}

make_dirs_and_devices() {
    local n i
    mkdir -p "$RUN_DIR" "$SPOOL_CTLD" "$LOG_DIR"
    for n in "${NODES[@]}"; do mkdir -p "$SPOOL_D/$n"; done
    for i in 0 1 2 3; do
        [[ -c /dev/fakegpu$i ]] || { rm -f "/dev/fakegpu$i"; mknod -m 666 "/dev/fakegpu$i" c 1 3; }
    done
}

# ---- daemon state ----------------------------------------------------------------------------------------
munged_pid() { pidfile_pid /run/munge/munged.pid; }
ctld_pid() { pidfile_pid "$RUN_DIR/slurmctld.pid"; }
slurmd_pid() { pidfile_pid "$RUN_DIR/slurmd-$1.pid"; }

ctld_up() { scontrol ping 2>/dev/null | grep -q 'is UP'; }

# Nodes whose state has none of the flags that mean "cannot run jobs".
responding_nodes() {
    sinfo -h -N -o '%N %t' 2>/dev/null | awk '$2 !~ /(down|drain|drng|fail|unk|inval|\*|~|#|!|%)/ {print $1}' | sort -u
}
all_nodes_responding() { [[ $(responding_nodes | wc -l) -eq ${#NODES[@]} ]]; }
all_nodes_idle() { [[ $(sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l) -eq ${#NODES[@]} ]]; }

cluster_up() {
    local n
    pid_alive "$(ctld_pid)" slurmctld || return 1
    for n in "${NODES[@]}"; do pid_alive "$(slurmd_pid "$n")" slurmd || return 1; done
    ctld_up && all_nodes_responding
}

# ---- start / stop ----------------------------------------------------------------------------------------
start_munged() {
    if ! pid_alive "$(munged_pid)" munged; then
        install -d -o munge -g munge -m 755 /run/munge
        runuser -u munge -- /usr/sbin/munged
        touch "$MUNGE_OURS"
        local i
        for ((i = 0; i < 50; i++)); do pid_alive "$(munged_pid)" munged && break; sleep 0.1; done
    fi
    munge -n 2>/dev/null | unmunge >/dev/null 2>&1 || die "munge credential round trip failed (munge -n | unmunge)"
}

start() {
    local t0=$SECONDS n
    install_packages
    mkdir -p "$RUN_DIR"
    if [[ -z $(sync_conf check) ]] && cluster_up; then
        log "cluster already up (4 nodes responding); nothing to do"
        return 0
    fi
    if [[ -n $(sync_conf check) ]] && pid_alive "$(ctld_pid)" slurmctld; then
        # Daemons read their config at start. Jobs are cancelled first: killing slurmd under a running job
        # leaves slurmstepd processes that ignore SIGTERM.
        log "config differs from the running cluster's: cancelling its jobs and restarting it"
        stop
    fi
    sync_conf write >/dev/null
    make_dirs_and_devices
    start_munged
    if ! pid_alive "$(ctld_pid)" slurmctld; then
        rm -f "$TEST_OWNED"  # a fresh cluster: whoever starts it now decides who stops it
        slurmctld || die "slurmctld failed to start (see $LOG_DIR/slurmctld.log)"
    fi
    wait_for ctld_up || die "slurmctld not UP after ${WAIT_S}s (see $LOG_DIR/slurmctld.log)"
    for n in "${NODES[@]}"; do
        pid_alive "$(slurmd_pid "$n")" slurmd || slurmd -N "$n" || die "slurmd -N $n failed (see $LOG_DIR/slurmd-$n.log)"
    done
    # A node drained by an earlier test run (state=drain) stays out until resumed.
    for n in $(sinfo -h -N -t drain,down -o %N 2>/dev/null | sort -u); do
        scontrol update nodename="$n" state=resume 2>/dev/null || true
    done
    # Responding (idle, or mixed/allocated by jobs recovered from the state save) is ready for new jobs.
    if ! wait_for all_nodes_responding; then
        sinfo -N >&2 || true
        die "not all ${#NODES[@]} nodes responding after ${WAIT_S}s (see $LOG_DIR/slurmd-node*.log)"
    fi
    log "cluster up: ${#NODES[@]} nodes ($(all_nodes_idle && echo idle || echo 'some busy')) in $((SECONDS - t0))s"
}

# Kill slurmstepd processes still bound to a socket in our spool (left when slurmd died under a job step).
kill_stray_stepds() {
    command -v ss >/dev/null || return 0
    local pid
    for pid in $(ss -xlpn 2>/dev/null | grep -F "$SPOOL_D/" | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u); do
        stop_pid "$pid" slurmstepd
    done
}

stop_daemons() {
    local n
    for n in "${NODES[@]}"; do stop_pid "$(slurmd_pid "$n")" slurmd; done
    stop_pid "$(ctld_pid)" slurmctld
    kill_stray_stepds
}

cancel_all_jobs() {
    ctld_up || return 0
    local ids
    ids=$(squeue -h -o %A 2>/dev/null | sort -u | tr '\n' ' ')
    [[ -n ${ids// /} ]] || return 0
    # shellcheck disable=SC2086  # ids is a space-separated list of numeric job ids
    scancel $ids 2>/dev/null || true
    no_jobs() { [[ -z $(squeue -h -o %A 2>/dev/null) ]]; }
    wait_for no_jobs || log "jobs still listed after ${WAIT_S}s: $(squeue -h -o '%A %T' | tr '\n' ' ')"
}

stop() {
    local t0=$SECONDS
    if command -v squeue >/dev/null && [[ -f $CONF_DIR/slurm.conf ]]; then cancel_all_jobs; fi
    stop_daemons
    if [[ -f $MUNGE_OURS ]]; then
        stop_pid "$(munged_pid)" munged
        rm -f "$MUNGE_OURS"
    fi
    rm -f "$TEST_OWNED"
    log "stopped in $((SECONDS - t0))s"
}

case ${1:-start} in
    start) start ;;
    stop) stop ;;
    status) command -v scontrol >/dev/null && [[ -f $CONF_DIR/slurm.conf ]] && cluster_up ;;
    *) die "usage: $0 [start|stop|status]" ;;
esac
