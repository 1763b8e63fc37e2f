#!/usr/bin/env bash
# A real Slurm on this machine (Debian's slurmctld + slurmd, munge for authentication), with
# several emulated nodes (one `slurmd -N zn<k>` per node, each on its own port), to
# run zcoll's torch backend under srun: srun --mpi=pmi2 serves MPICH the PMI it reads, so the
# backend starts as under mpirun (docs/launching.md).
#
#   scripts/slurm_cluster.sh start [NODES] [CPUS]   write the configuration, start the daemons,
#                                                   wait until the nodes are idle (default 2 x 2)
#   scripts/slurm_cluster.sh check [TASKS]          srun the comparison script of the tests
#                                                   (tests/torch_mpi/launchers.py) on TASKS (4) on one
#                                                   node, compare its results with mpirun's bitwise;
#                                                   again across every node, against mpirun with
#                                                   the same nodes (hydra's fork launcher)
#   scripts/slurm_cluster.sh stop                   stop its slurmctld and slurmds (munged, which
#                                                   other clusters may share, stays)
#   scripts/slurm_cluster.sh status                 sinfo and squeue
#
# Needs root and the packages: apt-get install -y slurmctld slurmd munge (Debian 12: Slurm 22.05).
# Everything lives under $ZCOLL_SLURM_DIR (default /tmp/zcoll-slurm); nothing is installed as a
# service. Ports: $ZCOLL_SLURM_PORT (slurmctld, default 16817) and the next ones (one per
# slurmd). After `start`, run your own jobs with the environment it prints, e.g.
#   SLURM_CONF=/tmp/zcoll-slurm/slurm.conf srun -N 2 -n 4 --mpi=pmi2 python train.py
set -euo pipefail

DIR=${ZCOLL_SLURM_DIR:-/tmp/zcoll-slurm}
PORT=${ZCOLL_SLURM_PORT:-16817}  # slurmctld's; the slurmds' follow it
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
MPIRUN=$(dirname "$PY")/mpirun
export SLURM_CONF=$DIR/slurm.conf

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | grep '^#' | sed 's/^# \{0,1\}//'; }
say() { echo "[slurm_cluster] $*"; }
need() {
  for b in slurmctld slurmd munged srun sinfo; do
    command -v "$b" >/dev/null || { say "missing $b: apt-get install -y slurmctld slurmd munge"; exit 3; }
  done
  [ "$(id -u)" = 0 ] || { say "needs root (slurmd starts the tasks as their user)"; exit 3; }
}

write_conf() {  # NODES CPUS
  local nodes=$1 cpus=$2 host
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
    echo "SlurmctldPort=$PORT"
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
    # every node on this host, each slurmd on its own port (Debian's slurmd runs several, -N)
    for ((k = 0; k < nodes; k++)); do
      echo "NodeName=zn$k NodeHostname=$host NodeAddr=127.0.0.1 Port=$((PORT + 1 + k)) CPUs=$cpus State=UNKNOWN"
    done
    echo "PartitionName=zcoll Nodes=zn[0-$((nodes - 1))] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
  } >"$SLURM_CONF"
  echo "ConstrainCores=no" >"$DIR/cgroup.conf"
}

start() {
  local nodes=${1:-2} cpus=${2:-2}
  need
  stop quiet
  write_conf "$nodes" "$cpus"
  if ! pgrep -x munged >/dev/null; then
    [ -s /etc/munge/munge.key ] || { mungekey -c 2>/dev/null || /usr/sbin/create-munge-key -f; }
    mkdir -p /run/munge && chown munge:munge /run/munge 2>/dev/null || true
    runuser -u munge -- /usr/sbin/munged 2>/dev/null || /usr/sbin/munged --force
  fi
  say "slurmctld"
  slurmctld -i
  for ((k = 0; k < nodes; k++)); do say "slurmd zn$k"; slurmd -N "zn$k"; done
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

digests() { grep -o 'ZCOLL-DIGEST [a-z_]* [0-9a-f]*' "$1" | sort -u; }

# One launch of the comparison script; its output in $DIR/check-NAME.log. NAME LAUNCHER-ARGS...
launch() {
  local name=$1 log="$DIR/check-$1.log"
  shift
  say "$name: $*"
  (cd "$ROOT" && PYTHONPATH=$ROOT/tests OMP_NUM_THREADS=1 MPIR_CVAR_DEVICE_COLLECTIVES=none \
    timeout 300 "$@") >"$log" 2>&1 || { say "$name failed ($?):"; tail -n 40 "$log"; return 1; }
  grep -E 'ZCOLL-(CASE|NODES|SUMMARY)' "$log" | sed 's/^/    /'
}

# Are the digests of two launches equal? NAME-A NAME-B
same() {
  if diff <(digests "$DIR/check-$1.log") <(digests "$DIR/check-$2.log") >/dev/null; then
    say "$1 and $2: results bitwise equal ($(digests "$DIR/check-$2.log" | wc -l) digests)"
  else
    say "$1's results DIFFER from $2's:"
    diff <(digests "$DIR/check-$1.log") <(digests "$DIR/check-$2.log") || true
    return 1
  fi
}

check() {
  local nodes hosts tasks=${1:-4} script=tests/torch_mpi/launchers.py cases="collectives torch_ops nodes" ok=0
  nodes=$(sinfo -h -o '%D' | head -1)
  launch srun-1node srun -N 1 -n "$tasks" --overcommit --mpi=pmi2 "$PY" -m mpi4py $script $cases || return 1
  launch mpirun-1node "$MPIRUN" -n "$tasks" "$PY" -m mpi4py $script $cases || return 1
  same srun-1node mpirun-1node || ok=1
  if [ "$nodes" -gt 1 ] && [ $((tasks % nodes)) = 0 ]; then
    # hydra's fork launcher with Slurm's node names: the same 2-node layout (block placement)
    hosts=$(sinfo -h -N -o '%N' | sort -u | paste -sd, -)
    launch "srun-${nodes}nodes" srun -N "$nodes" -n "$tasks" --overcommit --mpi=pmi2 "$PY" -m mpi4py $script \
      $cases "--nodes=$nodes" || return 1
    launch "mpirun-${nodes}nodes" "$MPIRUN" -launcher fork -hosts "$hosts" -ppn $((tasks / nodes)) -n "$tasks" \
      "$PY" -m mpi4py $script $cases "--nodes=$nodes" || return 1
    same "srun-${nodes}nodes" "mpirun-${nodes}nodes" || ok=1
  fi
  for log in "$DIR"/check-*.log; do
    grep -q "ZCOLL-SUMMARY passed=3 failed=0" "$log" || { say "not every case passed in $log"; ok=1; }
  done
  [ $ok = 0 ] && say "check passed"
  return $ok
}

case "${1:-}" in
  start) shift; start "$@" ;;
  stop) stop ;;
  check) shift; check "$@" ;;
  status) sinfo; squeue ;;
  -h | --help | help | "") usage ;;
  *) usage; exit 2 ;;
esac
