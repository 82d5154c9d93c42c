#!/usr/bin/env bash
# One call on a lent GPU machine (a PyTorch image, no internet): install milarun from a
# carried wheelhouse, run the GPU check within its budget, the soak (a rank killed, NCCL and
# DCP through torchrun's restart), then the short profile if time is left; every output in at
# most 8 files under $OUT (the device tool's limit).
#
# Prepared here, before the call:
#   bash scripts/wheelhouse.sh .wheelhouse     # git-ignored; about 21 MB for Python 3.12
# The call (device tool): carry [".wheelhouse"],
#   command "bash scripts/dev/gpu-session.sh .wheelhouse 300 0", timeout_s 560 (the soak: 150 s at most)
# Arguments: WHEELHOUSE [CHECK_BUDGET_S (300)] [PROFILE_S (0: no profile run)].
# Files under $OUT: install.log, nvidia-smi.txt, gpu_check.json, gpu_check.log,
# gpu_check-lite.tar.gz (the records, logs, summary and report of the check's lite pass, the
# node's short profile run), soak.tar.gz (the acceptance-cpu soak on the GPUs: its log,
# records and report) and, with PROFILE_S > 0,
# lite.log and lite.tar.gz (the profile's records, summary.json, report.txt).
set -uo pipefail
wheels=${1:?usage: gpu-session.sh WHEELHOUSE [CHECK_BUDGET_S] [PROFILE_S]}
budget=${2:-300}
profile_s=${3:-0}
out=${OUT:-$PWD/gpu-session-out}
mkdir -p "$out" /tmp/milarun-data/soak-tiny
t0=$SECONDS
log() { echo "gpu-session: [$((SECONDS - t0)) s] $*" | tee -a "$out/install.log"; }

nvidia-smi -q >"$out/nvidia-smi.txt" 2>&1 || log "nvidia-smi failed"
log "python: $(command -v python3) $(python3 --version 2>&1)"
if ! bash scripts/install-offline.sh "$wheels" >>"$out/install.log" 2>&1; then
  log "install-offline failed; trying with the checkout on PYTHONPATH and the wheels in a target"
  bash scripts/install-offline.sh --target /tmp/milarun-site "$wheels" >>"$out/install.log" 2>&1
  export PYTHONPATH=/tmp/milarun-site:$PWD PATH=/tmp/milarun-site/bin:$PATH
fi
python3 -m milarun devices >>"$out/install.log" 2>&1 || log "milarun devices: exit $?"
log "gpu_check, budget $budget s"
work=/tmp/gpu_check-work
python3 benchmarks/gpu_check.py --budget "$budget" -d /tmp/milarun-data --workdir "$work" \
  --out "$out/gpu_check.json" >"$out/gpu_check.log" 2>&1
log "gpu_check: exit $?"
if [ -d "$work/lite" ]; then
  # The lite pass is the node's short profile run: its records, summary and report are the
  # GPU baseline (baselines/gpu/<model>/).
  python3 -m milarun summary "$work/lite" -o "$work/lite-summary.json" >>"$out/gpu_check.log" 2>&1
  python3 -m milarun report "$work/lite" >"$work/lite-report.txt" 2>>"$out/gpu_check.log"
  tar -czf "$out/gpu_check-lite.tar.gz" -C "$work" lite lite-summary.json lite-report.txt
fi
# The soak of acceptance-cpu on every GPU of the node (njobs, NCCL): 20 optimizer steps
# of the tiny model whatever the GPU count, a checkpoint every 4, one rank killed.
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU') || gpus=1
soak=/tmp/milarun-soak
log "soak on $gpus GPU(s)"
timeout --signal=INT --kill-after=20 150 python3 -m milarun jobs profiles/acceptance-cpu.json \
  --name soak --no-cgexec -d /tmp/milarun-data/soak-tiny -o "$soak" -- --device cuda \
  --max-count $((20 * 128 * gpus)) >/tmp/soak.log 2>&1
log "soak: exit $?"
python3 -m milarun report "$soak" >/tmp/soak-report.txt 2>>/tmp/soak.log
[ -d "$soak" ] && tar -czf "$out/soak.tar.gz" -C /tmp "$(basename "$soak")" soak.log \
  soak-report.txt
if [ "$profile_s" -gt 0 ]; then
  res=/tmp/milarun-lite
  log "profiles/lite.json, at most $profile_s s"
  timeout --signal=INT --kill-after=20 "$profile_s" python3 -m milarun jobs profiles/lite.json \
    --no-cgexec -d /tmp/milarun-data -o "$res" >"$out/lite.log" 2>&1
  log "milarun jobs: exit $?"
  python3 -m milarun summary "$res" -o /tmp/summary.json >>"$out/lite.log" 2>&1
  python3 -m milarun report "$res" --weights weights/lite.json >/tmp/report.txt 2>>"$out/lite.log"
  [ -d "$res" ] && tar -czf "$out/lite.tar.gz" -C "$(dirname "$res")" "$(basename "$res")" \
    -C /tmp summary.json report.txt
fi
log "done"
