#!/usr/bin/env bash
# One command from a fresh clone: set up, run the embedded default profile
# (profiles/cpu.json: small, CPU-friendly, prepares its own data) on 2 CPU
# slots, write the report, and print where the results are.
#
#   bash scripts/quickstart.sh
#
# Environment: MILARUN_DATAROOT (default ./data), MILARUN_OUTROOT (default ./results).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

dataroot=${MILARUN_DATAROOT:-$PWD/data}
outroot=${MILARUN_OUTROOT:-$PWD/results}
outdir="$outroot/cpu-$(date '+%Y-%m-%d_%H-%M-%S')"
mkdir -p "$dataroot" "$outroot"

# Student cgroups when this host lets us create them, else run without.
cg=(--no-cgexec)
created=""
if [ "$(id -u)" = 0 ] && command -v cgexec >/dev/null 2>&1 && \
   created=$(bash scripts/cgroup_setup.sh --students 2 2>&1); then
  cg=()
  echo "quickstart: created (or updated) the student cgroups student0 and student1:"
  echo "$created" | sed 's/^/  /'
  echo "quickstart: they stay after the run; remove them with: sudo scripts/cgroup_setup.sh --remove"
else
  echo "quickstart: cannot create cgroups here (needs root and cgroup-tools): --no-cgexec"
  [ -n "$created" ] && echo "$created" | tail -n 3 | sed 's/^/  /'
fi

status=0
.venv/bin/milarun jobs profiles/cpu.json --cpu-slots 2 -d "$dataroot" -o "$outdir" "${cg[@]}" || status=$?
# The reference: the same profile on the 2-core development VM.
.venv/bin/milarun report "$outdir" --weights weights/cpu.json \
    --compare baselines/cpu/epyc-2core-vm.json --html "$outdir/report.html" || true
echo
echo "quickstart: results in $outdir"
echo "quickstart: HTML report in $outdir/report.html"
if [ ${#cg[@]} = 0 ]; then
  echo "quickstart: student cgroups student0 and student1 are still set up; remove them with: sudo scripts/cgroup_setup.sh --remove"
fi
exit $status
