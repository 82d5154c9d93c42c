#!/usr/bin/env bash
# Create the "student" cgroups milarun runs tests in: one per GPU (or CPU slot),
# each with an exclusive, equal slice of cores (local to its GPU's NUMA node),
# the memory nodes of those cores and RAM/N of memory. Works on cgroup v1 and v2.
#
#   sudo scripts/cgroup_setup.sh                    # one student per GPU
#   sudo scripts/cgroup_setup.sh --students 2       # e.g. 2 CPU slots
#   sudo scripts/cgroup_setup.sh --students 2 --memory 2G   # memory per student
#   sudo scripts/cgroup_setup.sh --remove
#
# Idempotent: running it again updates existing groups to the computed values.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x "$here/.venv/bin/python" ]; then PY="$here/.venv/bin/python"; else PY=python3; fi
fi
CGROOT=${MILARUN_CGROUP_ROOT:-/sys/fs/cgroup}
students=""
memory=""
remove=0
while [ $# -gt 0 ]; do
  case "$1" in
    --students) students=$2; shift 2 ;;
    --memory) memory=$2; shift 2 ;;
    --remove) remove=1; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "cgroup_setup.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

if [ -d "$CGROOT/cpuset" ] && [ -d "$CGROOT/memory" ]; then
  version=1
elif [ -f "$CGROOT/cgroup.controllers" ]; then
  version=2
else
  echo "cgroup_setup.sh: no usable cgroup hierarchy under $CGROOT" >&2; exit 1
fi

existing() {
  if [ $version = 1 ]; then
    ls -d "$CGROOT"/cpuset/student[0-9]* 2>/dev/null | xargs -r -n1 basename
  else
    ls -d "$CGROOT"/student[0-9]* 2>/dev/null | xargs -r -n1 basename
  fi
}

if [ $remove = 1 ]; then
  for g in $(existing); do
    if [ $version = 1 ]; then
      rmdir "$CGROOT/cpuset/$g" "$CGROOT/memory/$g" 2>/dev/null || true
    else
      rmdir "$CGROOT/$g" 2>/dev/null || true
    fi
    echo "removed $g"
  done
  exit 0
fi

if [ -z "$students" ]; then
  # one student per device milarun sees (any vendor, MIG instances included)
  students=$(cd "$here" && "$PY" -m milarun devices --count) || exit 2
  if [ -z "$students" ] || [ "$students" = 0 ]; then
    echo "cgroup_setup.sh: no GPU found; pass --students N for N CPU slots" >&2; exit 2
  fi
fi

mem_bytes=""
if [ -n "$memory" ]; then
  mem_bytes=$(numfmt --from=iec "$memory")
fi

# Placement is computed in Python (NVML GPU affinity, NUMA nodes): one line per student.
plan=$(cd "$here" && "$PY" -m milarun.host.students "$students" $([ -n "$mem_bytes" ] && echo $((mem_bytes * students))))

# Groups beyond the new count would overlap the new cpusets: drop them first.
for g in $(existing); do
  i=${g#student}
  if [ "$i" -ge "$students" ]; then
    if [ $version = 1 ]; then rmdir "$CGROOT/cpuset/$g" "$CGROOT/memory/$g" 2>/dev/null || true
    else rmdir "$CGROOT/$g" 2>/dev/null || true; fi
    echo "removed $g"
  fi
done

if [ $version = 1 ]; then
  # Exclusive flags are cleared first so that a new layout can move cores between groups.
  while read -r g cpus mems bytes; do
    mkdir -p "$CGROOT/cpuset/$g" "$CGROOT/memory/$g"
    echo 0 > "$CGROOT/cpuset/$g/cpuset.cpu_exclusive"
  done <<< "$plan"
  while read -r g cpus mems bytes; do
    echo "$mems" > "$CGROOT/cpuset/$g/cpuset.mems"
    echo "$cpus" > "$CGROOT/cpuset/$g/cpuset.cpus"
    echo "$bytes" > "$CGROOT/memory/$g/memory.limit_in_bytes"
  done <<< "$plan"
  while read -r g cpus mems bytes; do
    echo 1 > "$CGROOT/cpuset/$g/cpuset.cpu_exclusive" 2>/dev/null || \
      echo "warning: $g: could not mark cpuset exclusive (other groups share these cores)" >&2
    echo "$g: cpus=$cpus mems=$mems memory.limit_in_bytes=$bytes (cgroup v1: cpuset,memory)"
  done <<< "$plan"
else
  for c in cpuset memory; do
    grep -qw "$c" "$CGROOT/cgroup.subtree_control" || echo "+$c" > "$CGROOT/cgroup.subtree_control"
  done
  while read -r g cpus mems bytes; do
    mkdir -p "$CGROOT/$g"
    echo "$cpus" > "$CGROOT/$g/cpuset.cpus"
    echo "$mems" > "$CGROOT/$g/cpuset.mems"
    echo "$bytes" > "$CGROOT/$g/memory.max"
    if [ -f "$CGROOT/$g/cpuset.cpus.exclusive" ]; then
      echo "$cpus" > "$CGROOT/$g/cpuset.cpus.exclusive" 2>/dev/null || \
        echo "warning: $g: could not make cpus exclusive" >&2
    fi
    echo "$g: cpus=$cpus mems=$mems memory.max=$bytes (cgroup v2)"
  done <<< "$plan"
fi
