#!/usr/bin/env bash
# Prepare every dataset the standard profile needs, in its real on-disk format.
# Nothing is downloaded: the data are generated deterministically (see docs/workloads.md, "Datasets").
#
#   scripts/download.sh -d DATAROOT [--size standard|tiny]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dataroot=${MILARUN_DATAROOT:-}
size=standard
while [ $# -gt 0 ]; do
  case "$1" in
    -d|--dataroot) dataroot=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) echo "download.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "$dataroot" ]; then
  echo "download.sh: pass -d DATAROOT or set MILARUN_DATAROOT" >&2; exit 2
fi
mkdir -p "$dataroot"
MILARUN=${MILARUN:-$here/.venv/bin/milarun}
[ -x "$MILARUN" ] || MILARUN=milarun
"$MILARUN" dataset mnist fake_imagenet bsds500 coco wikitext2 wmt16 movielens \
  -d "$dataroot" --size "$size"
du -sh "$dataroot"/* 2>/dev/null || true
