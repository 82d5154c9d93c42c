#!/usr/bin/env bash
# Rehearse a GPU node's first install on this machine, so that the first GPU run fails
# only for GPU reasons:
#   bash scripts/dev/rehearse-image.sh [--python PY] [--image FILE] [--work DIR] [--quick]
#
# 1. "image": a scratch virtual environment (Python PY, default the newest 3.12 found)
#    holding the image's packages that milarun's dependencies resolve to, at the image's
#    versions (FILE, default scripts/image/pytorch-2.11.txt: torch 2.11.0, torchvision
#    0.26.0, transformers 5.17.0, ...), installed from the package index as the image's
#    maker did; nothing else.
# 2. the wheelhouse for that Python (scripts/wheelhouse.sh), its size printed;
# 3. scripts/install-offline.sh into the scratch environment with pip cut off from every
#    index and this machine's pip configuration (PIP_CONFIG_FILE=/dev/null, PIP_NO_INDEX);
# 4. `milarun devices`, `benchmarks/gpu_check.py --device cpu` and a cut-short
#    `milarun jobs profiles/cpu.json` (one warm-up window, 1 s of steady state a test; with
#    --quick only toy_reg, ddp_convnet, llm_fsdp, llm_lora, diffusion and vit), all with the
#    scratch environment's Python, from outside the checkout.
# Prints each step's time and ends with a line: what passed, what failed. Exit 1 when a
# step failed. Needs the network to the package index (step 1 and 2) and about 6 GB of disk.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
py="" image="$root/scripts/image/pytorch-2.11.txt" work=/tmp/milarun-rehearsal quick=0
while [ $# -gt 0 ]; do
  case "$1" in
    --python) py=$2; shift 2 ;;
    --image) image=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    *) echo "rehearse-image: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "$py" ]; then
  for candidate in "$(uv python find 3.12 2>/dev/null)" python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
    if [ -n "$candidate" ] && "$candidate" -c '' 2>/dev/null; then py=$candidate; break; fi
  done
  [ -n "$py" ] || { echo "rehearse-image: no working Python 3.12 found (give --python)" >&2; exit 2; }
fi
pyver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
venv="$work/venv" wheels="$work/wheels" data="$work/data" results="$work/results"
rm -rf "$venv" "$wheels" "$results"
mkdir -p "$work" "$data"
failed=()
step() {  # step NAME CMD...: run, time it, remember a failure
  local name=$1 t0 rc=0; shift
  t0=$EPOCHREALTIME
  echo "== rehearse-image: $name"
  "$@" || rc=$?
  printf "== rehearse-image: %s: %s in %.1f s\n" "$name" "$([ $rc = 0 ] && echo ok || echo "FAILED (exit $rc)")" \
    "$(awk "BEGIN {print $EPOCHREALTIME - $t0}")"
  [ $rc = 0 ] || failed+=("$name")
  return 0
}

make_image() {
  uv venv --quiet --seed --python "$py" "$venv"
  bash "$root/scripts/wheelhouse.sh" --python-version "$pyver" --image "$image" \
    --image-packages >"$work/image-packages.txt"
  uv pip install --quiet --python "$venv/bin/python" -r "$work/image-packages.txt"
  "$venv/bin/python" -c 'import torch, torchvision, transformers
print("image: torch", torch.__version__, "torchvision", torchvision.__version__,
      "transformers", transformers.__version__)'
}
offline_install() {
  (cd "$work" && env -u PIP_FIND_LINKS -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null \
     PIP_NO_INDEX=1 PYTHON="$venv/bin/python" bash "$root/scripts/install-offline.sh" "$wheels")
}
jobs_short() {
  local select=()
  # --quick: the tests that exercise the libraries whose versions differ most between
  # stacks (transformers, peft, diffusers, timm, torch.distributed with FSDP2)
  [ $quick = 1 ] && select=(--name toy_reg ddp_convnet llm_fsdp llm_lora diffusion vit)
  (cd "$work" && "$venv/bin/milarun" jobs "$root/profiles/cpu.json" --no-cgexec \
     --cpu-slots 2 -d "$data" -o "$results" "${select[@]}" -- \
     --max-count 1 --min-steady 1 --warmup 1 --sample-duration 0.25)
}

step "image ($(basename "$image"), Python $pyver)" make_image
step "wheelhouse" bash "$root/scripts/wheelhouse.sh" --python-version "$pyver" --image "$image" "$wheels"
[ -d "$wheels" ] && echo "wheelhouse: $(ls "$wheels" | wc -l) wheels, $(du -sh "$wheels" | cut -f1)"
step "install-offline" offline_install
step "milarun devices" bash -c "cd '$work' && '$venv/bin/milarun' devices"
step "gpu_check --device cpu" "$venv/bin/python" "$root/benchmarks/gpu_check.py" --device cpu \
  -d "$data" --out "$work/gpu_check.json"
step "milarun jobs profiles/cpu.json (cut short)" jobs_short
if [ ${#failed[@]} = 0 ]; then
  echo "rehearse-image: every step passed (torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)'))"
else
  echo "rehearse-image: FAILED: ${failed[*]}"
  exit 1
fi
