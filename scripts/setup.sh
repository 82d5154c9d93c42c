#!/usr/bin/env bash
# Install everything milarun needs on a fresh machine: uv, the hash-locked
# environment in .venv, milarun itself (editable) and, as root or with sudo,
# the apt packages (cgroup-tools, numactl, nocache). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v uv >/dev/null 2>&1; then
  echo "setup: installing uv with pip"
  python3 -m pip install --quiet uv
fi
UV=$(command -v uv || echo "python3 -m uv")

if [ ! -x .venv/bin/python ]; then
  $UV venv --quiet .venv
fi
echo "setup: syncing .venv with requirements.lock"
# Byte-compile at install time, so start-up does not depend on a writable cache
# (or on PYTHONDONTWRITEBYTECODE being unset).
$UV pip sync --quiet --compile-bytecode --python .venv/bin/python requirements.lock
$UV pip install --quiet --compile-bytecode --python .venv/bin/python --no-deps -e .

if [ "$(id -u)" = 0 ] || sudo -n true 2>/dev/null; then
  bash scripts/install-apt-packages.sh
else
  echo "setup: not root and no sudo: skipped apt packages (cgroup-tools, numactl, nocache)"
fi
echo "setup: done; activate with: source .venv/bin/activate"
