#!/usr/bin/env bash
# Build a folder of wheels that installs milarun into a GPU node's own PyTorch, offline:
#   bash scripts/wheelhouse.sh [--python-version 3.12] [--platform manylinux_2_28_x86_64]
#                              [--image scripts/image/pytorch-2.11.txt] DIR
# Run it where a package index is reachable; carry DIR to the node and run
# `bash scripts/install-offline.sh DIR` there (docs/setup.md). The work is in
# scripts/wheelhouse.py, run by uv in a throw-away environment holding pip and packaging.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if ! command -v uv >/dev/null 2>&1; then
  echo "wheelhouse: installing uv with pip" >&2
  python3 -m pip install --quiet uv
fi
UV=$(command -v uv || echo "python3 -m uv")
exec $UV run --no-project --quiet --python '>=3.11' --with packaging --with pip \
  -- python "$here/wheelhouse.py" "$@"
