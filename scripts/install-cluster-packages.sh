#!/usr/bin/env bash
# System packages of the local test cluster (scripts/slurm-local.sh, scripts/sshd-local.sh):
# Slurm (slurmctld, slurmd, srun, sbatch), munge and the OpenSSH server and client.
# Skips when all are present. Needs root (or sudo).
set -euo pipefail
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
missing=0
for c in slurmctld slurmd srun sbatch scancel munged sshd ssh ssh-keygen; do
  command -v "$c" >/dev/null 2>&1 || [ -x "/usr/sbin/$c" ] || missing=1
done
if [ $missing = 0 ]; then
  echo "install-cluster-packages.sh: slurm-wlm, munge and openssh-server are installed"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq slurm-wlm munge openssh-server openssh-client
