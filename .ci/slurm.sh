#!/usr/bin/env bash
# A single-node SLURM for the tests (CI runs as root): `slurm.sh start DIR` writes a slurm.conf
# under DIR, starts munged, slurmctld and slurmd and waits until the node is idle; `slurm.sh stop
# DIR` stops them. Debian's slurm-wlm and munge must be installed (.ci/run installs them).
set -euo pipefail
action=$1
dir=$(readlink -f "${2:-/tmp/kahm-dask-slurm}")
conf_dir=/etc/slurm
case "$action" in
start)
  mkdir -p "$dir"/{state,spool,log} /run/munge /var/log/munge /etc/munge "$conf_dir"
  if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
  chown -R munge:munge /etc/munge /run/munge /var/log/munge 2>/dev/null || true
  chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key
  host=$(hostname -s)
  cpus=$(nproc)
  mem=$(awk '/MemTotal/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)
  cat > "$conf_dir/slurm.conf" <<CONF
ClusterName=kahmdask
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ReturnToService=2
MpiDefault=none
SchedulerType=sched/backfill
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
  pgrep -x munged >/dev/null || su -s /bin/sh munge -c "/usr/sbin/munged --force" 2>/dev/null || /usr/sbin/munged --force
  pgrep -x slurmctld >/dev/null || /usr/sbin/slurmctld
  pgrep -x slurmd >/dev/null || /usr/sbin/slurmd
  for _ in $(seq 60); do
    if sinfo -h -o '%t' 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then
      echo "slurm: node $host ready ($(sinfo -h -o '%t %c CPUs %m MB'))"; exit 0
    fi
    scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true
    sleep 1
  done
  echo "slurm: the node did not become idle within 60 s" >&2
  sinfo >&2 || true; tail -20 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2 || true
  exit 1
  ;;
stop)
  scancel --user="$(id -un)" >/dev/null 2>&1 || true
  pkill -x slurmd || true; pkill -x slurmctld || true; pkill -x munged || true
  ;;
*) echo "usage: slurm.sh start|stop DIR" >&2; exit 2 ;;
esac
