#!/usr/bin/env bash
# A one-node SLURM on this machine, from Debian's packages (scripts/setup-slurm.sh installs them):
# munged, slurmctld and slurmd started by hand (no systemd), this host as the only node, its CPUs
# and memory as `slurmd -C` reports them, optionally count-only GPUs (their device files: /dev/null),
# no accounting database (job status by `squeue`; finished jobs in a job-completion log).
#
#   scripts/slurm-local.sh up [--gpus N]   write the config, keys and state, start the daemons
#   scripts/slurm-local.sh status          what runs, and the queue
#   scripts/slurm-local.sh down            stop exactly the daemons `up` started (by their pid files)
#   source "$DIR/env"                      SLURM_CONF for sbatch/squeue/scancel and Snakemake
#
# Everything lives under one folder: $SPECMATCH_SLURM_DIR (default /tmp/specmatch-slurm): etc/
# (slurm.conf, gres.conf), munge/ (key, socket, pid), state/, spool/, log/ (daemon logs and
# jobcomp.log), run/ (pid files). One thing outside it: the link /run/slurm/conf -> $DIR/etc, where
# SLURM's commands on a node look for the configuration when SLURM_CONF is not set (the place a
# configless slurmd puts its copy). Snakemake's jobstep plugin clears SLURM_CONF before the `srun`
# it runs inside an allocation, so without it that srun finds no configuration. `down` removes it.
# Ports: $SPECMATCH_SLURM_PORT (slurmctld, default 6817) and the next one (slurmd).
# Process tracking: $SPECMATCH_SLURM_PROCTRACK: linuxproc (default: every descendant of a step is
# signalled, so scancel's SIGTERM reaches a measuring cell), pgid, or cgroup (runs jobs in this
# project's containers, but there only a step's first process gets the SIGTERM: the others
# learn of a cancel by the SIGKILL after KillWait).
# As root: slurmd starts every job's processes as the submitting user.
set -euo pipefail
DIR=${SPECMATCH_SLURM_DIR:-/tmp/specmatch-slurm}
PORT=${SPECMATCH_SLURM_PORT:-6817}
PROCTRACK=${SPECMATCH_SLURM_PROCTRACK:-linuxproc}
NODE=$(hostname -s)
PARTITION=local
RUNCONF=/run/slurm/conf
export SLURM_CONF="$DIR/etc/slurm.conf"

die() { echo "slurm-local: $*" >&2; exit 1; }

alive() {  # pid file -> 0 if the process it names runs (a zombie counts as gone)
  local pid
  [[ -s $1 ]] || return 1
  pid=$(cat "$1")
  [[ -d /proc/$pid ]] && ! grep -q '^State:[[:space:]]*Z' "/proc/$pid/status" 2>/dev/null
}

wait_for() {  # seconds description command... : poll until the command succeeds
  local n=$(($1 * 10)) what=$2
  shift 2
  while ((n-- > 0)); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  die "$what did not come up; see $DIR/log"
}

write_config() {
  local gpus=$1 node_line gres_line=""
  # this machine as `slurmd -C` sees it (CPUs, sockets, cores, threads, memory), under our node name
  node_line=$(slurmd -C | head -1 | sed -E "s/^NodeName=[^ ]+/NodeName=$NODE/")
  node_line+=" NodeAddr=127.0.0.1 State=UNKNOWN"
  if ((gpus > 0)); then
    # Count-only GPUs: SLURM counts and allocates them (sbatch --gpus) and sets CUDA_VISIBLE_DEVICES
    # in the job as on a GPU node, but there is no GPU behind them. SLURM 22.05's gres/gpu drops a
    # gres.conf line without File= ("Removing file-less GPU"), so each GPU's file is a link to
    # /dev/null: a character device that nothing binds (TaskPlugin=task/none constrains no devices).
    node_line+=" Gres=gpu:$gpus"
    gres_line="GresTypes=gpu"
    mkdir -p "$DIR/dev"
    rm -f "$DIR"/dev/gpu*
    for ((i = 0; i < gpus; i++)); do ln -s /dev/null "$DIR/dev/gpu$i"; done
    echo "NodeName=$NODE Name=gpu File=$DIR/dev/gpu[0-$((gpus - 1))]" > "$DIR/etc/gres.conf"
  else
    echo "# written by scripts/slurm-local.sh up: no GPUs" > "$DIR/etc/gres.conf"
  fi
  # proctrack/cgroup (SPECMATCH_SLURM_PROCTRACK=cgroup) tracks a job's processes in a cgroup of its
  # own; nothing is constrained (cores, memory, devices): the tests measure, they do not isolate
  printf '%s\n' "CgroupPlugin=autodetect" "CgroupMountpoint=/sys/fs/cgroup" "ConstrainCores=no" \
    "ConstrainRAMSpace=no" "ConstrainDevices=no" > "$DIR/etc/cgroup.conf"
  cat > "$SLURM_CONF" <<EOF
# written by scripts/slurm-local.sh up: a one-node SLURM for the tests (no systemd, no accounting)
ClusterName=specmatch
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/slurmd-%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/$PROCTRACK
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/log/jobcomp.log
MpiDefault=none
ReturnToService=2
# finished jobs stay visible to squeue for 10 minutes (Snakemake's status polls need them)
MinJobAge=600
KillWait=10
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
$gres_line
$node_line
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
}

up() {
  local gpus=0
  while (($#)); do
    case $1 in
      --gpus) gpus=$2; shift 2 ;;
      *) die "unknown option $1" ;;
    esac
  done
  [[ $(id -u) -eq 0 ]] || die "needs root (slurmd starts jobs as their user)"
  for exe in munged slurmctld slurmd squeue; do
    command -v "$exe" >/dev/null || die "$exe is missing: run scripts/setup-slurm.sh"
  done
  if alive "$DIR/run/slurmctld.pid" || alive "$DIR/run/slurmd.pid" || alive "$DIR/munge/munged.pid"; then
    die "already running under $DIR (scripts/slurm-local.sh down first)"
  fi
  if [[ -e /etc/slurm/slurm.conf ]]; then
    die "/etc/slurm/slurm.conf exists: commands inside an allocation would read it, not this cluster's"
  fi
  if [[ -L $RUNCONF && $(readlink "$RUNCONF") != "$DIR/etc" ]]; then
    other=$(dirname "$(readlink "$RUNCONF")")
    if alive "$other/run/slurmctld.pid" || alive "$other/run/slurmd.pid"; then
      die "$RUNCONF is the configuration of another local SLURM, still running: SPECMATCH_SLURM_DIR=$other $0 down"
    fi
    rm -f "$RUNCONF"   # left by a local SLURM whose daemons are gone
  elif [[ -e $RUNCONF && ! -L $RUNCONF ]]; then
    die "$RUNCONF exists and is not a local SLURM's: another SLURM runs on this machine"
  fi
  mkdir -p "$DIR"/{etc,state,spool,log,run}
  install -d -m 700 "$DIR/munge"
  rm -rf "${DIR:?}"/state/* "${DIR:?}"/spool/* "${DIR:?}"/log/*   # a fresh cluster: job ids from 1, no old jobs
  if [[ ! -s $DIR/munge/munge.key ]]; then
    (umask 077; dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none)
  fi
  write_config "$gpus"
  [[ -d /run/slurm ]] || { mkdir -p /run/slurm && touch "$DIR/run/made-run-slurm"; }
  ln -sfn "$DIR/etc" "$RUNCONF"
  munged --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" \
    --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/munge/munged.log" \
    --seed-file="$DIR/munge/munged.seed" --num-threads=2 --force
  wait_for 10 munged alive "$DIR/munge/munged.pid"
  slurmctld -i -f "$SLURM_CONF"     # -i: ignore (discard) any state: this cluster starts empty
  wait_for 20 slurmctld scontrol ping
  slurmd -f "$SLURM_CONF" -N "$NODE"
  wait_for 30 "node $NODE" node_idle
  cat > "$DIR/env" <<EOF
export SLURM_CONF=$SLURM_CONF
EOF
  echo "slurm-local: up under $DIR (node $NODE, partition $PARTITION, $(node_field CPUTot) CPUs," \
    "$(node_field RealMemory) MB, gpus $gpus, proctrack/$PROCTRACK, port $PORT)"
}

node_field() { scontrol show node "$NODE" | tr ' ' '\n' | sed -n "s/^$1=//p" | head -1; }
node_idle() { [[ $(sinfo -h -n "$NODE" -o %t) == idle* ]]; }

stop_one() {  # name pidfile: SIGTERM the process the file names, wait, SIGKILL if it lingers
  local name=$1 file=$2 pid n
  if ! alive "$file"; then
    rm -f "$file"
    return 0
  fi
  pid=$(cat "$file")
  kill -TERM "$pid" 2>/dev/null || true
  for ((n = 0; n < 150; n++)); do
    [[ -d /proc/$pid ]] || break
    sleep 0.1
  done
  if [[ -d /proc/$pid ]]; then
    echo "slurm-local: $name ($pid) still running after 15 s: SIGKILL" >&2
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$file"
  echo "slurm-local: stopped $name ($pid)"
}

down() {
  [[ -d $DIR ]] || { echo "slurm-local: nothing under $DIR"; return 0; }
  if alive "$DIR/run/slurmctld.pid" && [[ -f $SLURM_CONF ]]; then
    # end every job first (their processes belong to slurmd's steps, which end with them)
    scancel --quiet --partition="$PARTITION" 2>/dev/null || true
    for ((n = 0; n < 100; n++)); do
      [[ -z $(squeue -h -t PD,R,CG,S 2>/dev/null) ]] && break
      sleep 0.2
    done
  fi
  stop_one slurmd "$DIR/run/slurmd.pid"
  stop_one slurmctld "$DIR/run/slurmctld.pid"
  stop_one munged "$DIR/munge/munged.pid"
  rm -f "$DIR/munge/munge.socket" "$DIR/munge/munge.socket.lock"
  if [[ -L $RUNCONF && $(readlink "$RUNCONF") == "$DIR/etc" ]]; then
    rm -f "$RUNCONF"
    if [[ -f $DIR/run/made-run-slurm ]]; then
      rmdir /run/slurm 2>/dev/null || true
      rm -f "$DIR/run/made-run-slurm"
    fi
  fi
}

status() {
  local name file rc=0
  for name in munged slurmctld slurmd; do
    file=$DIR/run/$name.pid
    [[ $name == munged ]] && file=$DIR/munge/munged.pid
    if alive "$file"; then echo "$name: running (pid $(cat "$file"))"; else echo "$name: stopped"; rc=1; fi
  done
  if ((rc == 0)); then
    sinfo -N -o "%N %t %C %m %G"
    squeue -o "%i %j %T %M %l %C %b %R"
  fi
  return $rc
}

case ${1:-} in
  up) shift; up "$@" ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up [--gpus N] | down | status   (folder: \$SPECMATCH_SLURM_DIR, now $DIR)" >&2; exit 2 ;;
esac
