#!/usr/bin/env bash
# A real Slurm on this machine (Debian's slurmctld + slurmd, munge for authentication), with
# several emulated nodes when slurmd supports it (one slurmd per NodeName, distinct ports), to
# run zcoll's torch backend under srun: srun --mpi=pmi2 serves MPICH the PMI it reads, so the
# backend starts as under mpirun (docs/launching.md).
#
#   scripts/slurm_cluster.sh start [NODES] [CPUS]   write the configuration, start the daemons,
#                                                   wait until the nodes are idle (default 2 x 2)
#   scripts/slurm_cluster.sh check                  srun the comparison script of the tests
#                                                   (tests/torch_mpi/launchers.py) on 4 tasks
#   scripts/slurm_cluster.sh stop                   stop the daemons this script started
#   scripts/slurm_cluster.sh status                 sinfo and squeue
#
# Needs root and the packages: apt-get install -y slurmctld slurmd munge (Debian 12: Slurm 22.05).
# Everything lives under $ZCOLL_SLURM_DIR (default /tmp/zcoll-slurm); nothing is installed as a
# service. After `start`, run your own jobs with the environment it prints, e.g.
#   SLURM_CONF=/tmp/zcoll-slurm/slurm.conf srun -N 2 -n 4 --mpi=pmi2 python train.py
set -euo pipefail

DIR=${ZCOLL_SLURM_DIR:-/tmp/zcoll-slurm}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
export SLURM_CONF=$DIR/slurm.conf

usage() { sed -n '2,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
say() { echo "[slurm_cluster] $*"; }
need() {
  for b in slurmctld slurmd munged srun sinfo; do
    command -v "$b" >/dev/null || { say "missing $b: apt-get install -y slurmctld slurmd munge"; exit 3; }
  done
  [ "$(id -u)" = 0 ] || { say "needs root (slurmd starts the tasks as their user)"; exit 3; }
}

write_conf() {  # NODES CPUS MULTI
  local nodes=$1 cpus=$2 multi=$3 host
  host=$(hostname -s)
  mkdir -p "$DIR/state" "$DIR/log" "$DIR/run"
  {
    echo "ClusterName=zcoll"
    echo "SlurmctldHost=$host(127.0.0.1)"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/munge"
    echo "CredType=cred/munge"
    echo "StateSaveLocation=$DIR/state"
    echo "SlurmdSpoolDir=$DIR/spool-%n"
    echo "SlurmctldPidFile=$DIR/run/slurmctld.pid"
    echo "SlurmdPidFile=$DIR/run/slurmd-%n.pid"
    echo "SlurmctldLogFile=$DIR/log/slurmctld.log"
    echo "SlurmdLogFile=$DIR/log/slurmd-%n.log"
    echo "SlurmctldPort=16817"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "SchedulerType=sched/builtin"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_CPU"
    echo "SlurmdParameters=config_overrides"
    echo "MpiDefault=pmi2"
    echo "ReturnToService=2"
    echo "InactiveLimit=0"
    echo "KillWait=5"
    if [ "$multi" = 1 ]; then
      for ((k = 0; k < nodes; k++)); do
        echo "NodeName=zn$k NodeHostname=$host NodeAddr=127.0.0.1 Port=$((17000 + k)) CPUs=$cpus State=UNKNOWN"
      done
      echo "PartitionName=zcoll Nodes=zn[0-$((nodes - 1))] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
    else
      echo "NodeName=$host NodeAddr=127.0.0.1 Port=17000 CPUs=$((nodes * cpus)) State=UNKNOWN"
      echo "PartitionName=zcoll Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
    fi
  } >"$SLURM_CONF"
  echo "ConstrainCores=no" >"$DIR/cgroup.conf"
}

start() {
  local nodes=${1:-2} cpus=${2:-2} multi=1
  need
  stop quiet
  # several slurmd on one host need a Slurm built with --enable-multiple-slurmd (slurmd -N)
  if ! slurmd -h 2>&1 | grep -q -- "-N"; then multi=0; fi
  write_conf "$nodes" "$cpus" "$multi"
  if ! pgrep -x munged >/dev/null; then
    [ -s /etc/munge/munge.key ] || { mungekey -c 2>/dev/null || /usr/sbin/create-munge-key -f; }
    mkdir -p /run/munge && chown munge:munge /run/munge 2>/dev/null || true
    runuser -u munge -- /usr/sbin/munged 2>/dev/null || /usr/sbin/munged --force
    echo "munged" >"$DIR/run/started-munged"
  fi
  say "slurmctld"
  slurmctld -i
  if [ "$multi" = 1 ]; then
    for ((k = 0; k < nodes; k++)); do say "slurmd zn$k"; slurmd -N "zn$k"; done
  else
    say "slurmd (one node with $((nodes * cpus)) CPUs: this slurmd cannot emulate several nodes)"
    slurmd
  fi
  for _ in $(seq 60); do
    if [ "$(sinfo -h -o '%t' | sort -u | tr -d ' \n')" = "idle" ]; then
      sinfo
      say "ready: export SLURM_CONF=$SLURM_CONF"
      return 0
    fi
    sleep 1
  done
  sinfo || true
  say "nodes did not become idle within 60 s; logs in $DIR/log"
  tail -n 20 "$DIR"/log/*.log
  exit 1
}

stop() {
  local pidfile
  for pidfile in "$DIR"/run/slurmd-*.pid "$DIR"/run/slurmctld.pid; do
    [ -f "$pidfile" ] || continue
    kill "$(cat "$pidfile")" 2>/dev/null || true
    rm -f "$pidfile"
  done
  [ "${1:-}" = quiet ] || say "stopped"
}

check() {
  local nodes
  nodes=$(sinfo -h -o '%D' | head -1)
  say "srun -N $nodes -n 4 --mpi=pmi2 $PY tests/torch_mpi/launchers.py collectives torch_ops nodes --nodes=$nodes"
  cd "$ROOT"
  PYTHONPATH=$ROOT/tests OMP_NUM_THREADS=1 timeout 300 \
    srun -N "$nodes" -n 4 --mpi=pmi2 --label "$PY" tests/torch_mpi/launchers.py collectives torch_ops nodes \
    "--nodes=$nodes"
}

case "${1:-}" in
  start) shift; start "$@" ;;
  stop) stop ;;
  check) check ;;
  status) sinfo; squeue ;;
  -h | --help | help | "") usage ;;
  *) usage; exit 2 ;;
esac
