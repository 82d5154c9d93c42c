#!/usr/bin/env bash
# System packages milarun uses: cgexec/cgcreate (cgroup-tools), numactl, nocache.
set -euo pipefail
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
if command -v cgexec >/dev/null && command -v numactl >/dev/null && command -v nocache >/dev/null; then
  echo "install-apt-packages.sh: cgroup-tools, numactl and nocache are installed"
  exit 0
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq cgroup-tools numactl nocache
