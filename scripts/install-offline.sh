#!/usr/bin/env bash
# Install milarun from a wheelhouse (scripts/wheelhouse.sh) into the active Python
# environment, without a package index and without touching its torch:
#   bash scripts/install-offline.sh [--target FOLDER] DIR
# PYTHON (default: python3) names the environment's interpreter.
#
# 1. Every runtime requirement of the milarun wheel in DIR is checked against the
#    environment: an installed package out of range (torch 2.10 where milarun supports
#    >=2.11,<2.14) is refused, never replaced; a missing one must have a wheel in DIR.
# 2. pip resolves the install against the environment with --dry-run (nothing is
#    written): a wheel missing from DIR stops here.
# 3. Exactly the wheels pip chose are installed, with --no-deps: into the environment
#    when its site-packages can be written, else into FOLDER (--target; default
#    ~/milarun-site), and the PYTHONPATH and PATH lines to use are printed.
# On any failure: one "install-offline: error:" line, exit 2, and what this run had
# installed is removed again.
set -euo pipefail

die() { echo "install-offline: error: $*" >&2; exit 2; }

target=""
dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --target) [ $# -ge 2 ] || die "--target needs a folder"; target=$2; shift 2 ;;
    --target=*) target=${1#--target=}; shift ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $1" ;;
    *) [ -z "$dir" ] || die "one wheelhouse folder, got $dir and $1"; dir=$1; shift ;;
  esac
done
[ -n "$dir" ] || die "usage: bash scripts/install-offline.sh [--target FOLDER] DIR"
[ -d "$dir" ] || die "$dir: no such folder (build it with scripts/wheelhouse.sh)"
dir=$(cd "$dir" && pwd)
PY=${PYTHON:-python3}
command -v "$PY" >/dev/null 2>&1 || die "no Python interpreter $PY (set PYTHON)"

shopt -s nullglob
wheels=("$dir"/milarun-*.whl)
[ ${#wheels[@]} -eq 1 ] || die "$dir: expected one milarun-*.whl, found ${#wheels[@]}"
wheel=${wheels[0]}
"$PY" -m pip --version >/dev/null 2>&1 || die "$PY has no pip (python -m pip)"

# Step 1: the wheel's requirements against what is installed (pip's own packaging).
"$PY" - "$wheel" "$dir" <<'EOF' || exit 2
import sys, zipfile
from importlib import metadata
from pathlib import Path
try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name

wheel, folder = sys.argv[1], Path(sys.argv[2])
with zipfile.ZipFile(wheel) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    lines = z.read(meta).decode().splitlines()
offered = {canonicalize_name(p.name.split("-")[0]) for p in folder.glob("*.whl")}
bad = []
for line in lines:
    if not line.startswith("Requires-Dist:"):
        continue
    req = Requirement(line.split(":", 1)[1].strip())
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    try:
        have = metadata.version(req.name)
    except metadata.PackageNotFoundError:
        if canonicalize_name(req.name) not in offered:
            bad.append(f"{req.name} is neither installed nor in {folder} (milarun needs {req})")
        continue
    if req.specifier and not req.specifier.contains(have, prereleases=True):
        bad.append(f"{req.name} {have} is installed; milarun supports {req}"
                   + (" (the environment's torch is never replaced)"
                      if canonicalize_name(req.name) in ("torch", "torchvision") else ""))
if bad:
    print("install-offline: error: " + "; ".join(bad) + "; nothing installed", file=sys.stderr)
    sys.exit(2)
EOF

# Step 2: what pip would install, resolved against this environment; nothing written.
work=$(mktemp -d)
installed_here=()
cleanup() {
  local status=$?
  if [ $status -ne 0 ] && [ ${#installed_here[@]} -gt 0 ]; then
    "$PY" -m pip uninstall -y -q "${installed_here[@]}" >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
  exit $status
}
trap cleanup EXIT
if ! "$PY" -m pip install --dry-run --no-index --find-links "$dir" --quiet \
      --report "$work/report.json" "$wheel" 2>"$work/err"; then
  die "$(grep -v '^\s*$' "$work/err" | grep -m1 -i 'error' || tail -n1 "$work/err"); nothing installed"
fi
"$PY" - "$work/report.json" >"$work/plan" <<'EOF'
import json, sys
from urllib.parse import unquote, urlparse
for item in json.load(open(sys.argv[1]))["install"]:
    url = item["download_info"]["url"]
    print(item["metadata"]["name"], unquote(urlparse(url).path))
EOF
names=(); files=()
while read -r name file; do names+=("$name"); files+=("$file"); done <"$work/plan"
if [ ${#names[@]} = 0 ]; then
  echo "install-offline: nothing to install: milarun and its dependencies are already there"
  exit 0
fi
case " ${names[*]} " in
  *" torch "*|*" torchvision "*) die "pip would install torch or torchvision from $dir; nothing installed" ;;
esac

# Step 3: install exactly those wheels, here or into a target folder.
site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ -z "$target" ] && [ -w "$site" ]; then
  echo "install-offline: installing ${#files[@]} wheels into $site: ${names[*]}"
  mapfile -t installed_here < <("$PY" -c '
import sys
from importlib import metadata
for name in sys.argv[1:]:
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        print(name)' "${names[@]}")
  "$PY" -m pip install --no-index --no-deps --quiet "${files[@]}" 2>"$work/err" \
    || die "pip install failed: $(tail -n1 "$work/err"); what this run installed is removed"
  env_line=""
else
  target=${target:-$HOME/milarun-site}
  [ -w "$site" ] || echo "install-offline: $site cannot be written: installing into $target"
  mkdir -p "$target" 2>/dev/null && [ -w "$target" ] || die "$target cannot be written"
  stage=$(mktemp -d "$target/.install.XXXXXX")
  echo "install-offline: installing ${#files[@]} wheels into $target: ${names[*]}"
  if ! "$PY" -m pip install --no-index --no-deps --quiet --target "$stage" "${files[@]}" \
        2>"$work/err"; then
    rm -rf "$stage"
    die "pip install failed: $(tail -n1 "$work/err"); nothing installed"
  fi
  cp -a "$stage"/. "$target"/ && rm -rf "$stage"
  env_line="export PYTHONPATH=$target\${PYTHONPATH:+:\$PYTHONPATH} PATH=$target/bin:\$PATH"
fi
torch_version=$("$PY" -c 'from importlib.metadata import version; print(version("torch"))' 2>/dev/null || true)
echo "install-offline: done${torch_version:+; torch $torch_version untouched}"
if [ -n "$env_line" ]; then
  echo "install-offline: use it with:  $env_line"
fi
echo "install-offline: check with:  milarun devices   (or: $PY -m milarun devices)"
