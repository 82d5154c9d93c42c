"""Build a folder of wheels that installs milarun into a PyTorch image without internet.

Usage (on a machine that reaches a package index; see docs/setup.md)::

    python3 scripts/wheelhouse.py [--python-version 3.12] [--platform manylinux_2_28_x86_64]
                                  [--image scripts/image/pytorch-2.11.txt] DIR

What DIR holds: the milarun wheel and a wheel of every runtime dependency of milarun
that the image does not already hold, for the target Python and platform (pip's
cross-platform download), resolved together with the image's pinned versions (so a
dependency that needs another torch or numpy than the image's fails here, not on the
node). ``scripts/install-offline.sh DIR`` installs it there.

Needs Python 3.11 or later (tomllib), uv (``python3 -m pip install uv``) and pip.
Exit 0 with the folder's size printed; 2 with one ``wheelhouse: error:`` line on bad
input (a malformed image list, a platform pip cannot serve, an existing non-empty DIR,
a package without a wheel for the target); nothing is left at DIR on failure (the
wheels are gathered in a temporary folder beside it, renamed at the end).
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import tomllib
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_IMAGE = ROOT / "scripts" / "image" / "pytorch-2.11.txt"
PLATFORM = re.compile(r"manylinux_2_(\d+)_(x86_64|aarch64)")


class Refused(Exception):
    """Bad input or a step that failed: one line, exit 2."""


def read_image(path):
    """The packages of an image list: canonical name -> ``Requirement``.

    The file: one PEP 508 requirement a line (``torch==2.11.0``, or a bare name),
    ``#`` comments, blank lines.

    Raises:
        Refused: the file cannot be read, or ``path:line`` is not a requirement.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise Refused(f"{path}: cannot read the image list ({exc})")
    out = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            reason = str(exc).splitlines()[0]
            raise Refused(f"{path}:{number}: not a package requirement: {line!r} ({reason})")
        out[canonicalize_name(req.name)] = req
    return out


def declared(pyproject=ROOT / "pyproject.toml"):
    """milarun's runtime requirements, as ``[project].dependencies`` of ``pyproject``
    declares them (``Requirement`` objects, extras left out)."""
    with open(pyproject, "rb") as f:
        project = tomllib.load(f)["project"]
    return [Requirement(line) for line in project["dependencies"]]


def not_in_image(requirements, image):
    """The requirements whose package the image does not hold (canonical names)."""
    return sorted(
        canonicalize_name(r.name) for r in requirements if canonicalize_name(r.name) not in image
    )


def pip_platforms(platform):
    """pip's ``--platform`` values for a ``manylinux_2_N_ARCH`` target: pip matches tags
    exactly, so every older glibc's tag (and its legacy alias) is named too.

    Raises:
        Refused: ``platform`` is not ``manylinux_2_N_x86_64`` or ``manylinux_2_N_aarch64``.
    """
    m = PLATFORM.fullmatch(platform)
    if not m:
        raise Refused(
            f"--platform {platform!r}: expected manylinux_2_N_x86_64 or "
            "manylinux_2_N_aarch64 (N: the node's glibc minor version, e.g. 28)"
        )
    glibc, arch = int(m.group(1)), m.group(2)
    if glibc < 17:
        raise Refused(
            f"--platform {platform!r}: glibc 2.{glibc} is older than any "
            "PyTorch build (manylinux_2_17 at least)"
        )
    tags = [f"manylinux_2_{n}_{arch}" for n in range(glibc, 4, -1)]
    tags += [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}"]
    return tags


def run(argv, what):
    """Run ``argv``; its stdout. Raises Refused with ``what`` and stderr's last line."""
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = [line for line in proc.stderr.splitlines() if line.strip()]
        raise Refused(f"{what} failed: {tail[-1] if tail else 'exit ' + str(proc.returncode)}")
    return proc.stdout


def resolve(requirements, image, python_version, platform, work):
    """Pin milarun's dependency closure for the target with uv, the image's pinned
    versions as constraints.

    Returns:
        (pins the image does not hold, pins it holds): two lists of ``"name==version"``.
    """
    m = PLATFORM.fullmatch(platform)
    reqs = work / "requirements.in"
    reqs.write_text("".join(f"{r}\n" for r in requirements))
    pins = work / "image-constraints.txt"
    pins.write_text("".join(f"{r}\n" for r in image.values() if r.specifier))
    uv = shutil.which("uv")
    argv = ([uv] if uv else [sys.executable, "-m", "uv"]) + [
        "pip",
        "compile",
        str(reqs),
        "--constraint",
        str(pins),
        "--no-header",
        "--no-annotate",
        "--quiet",
        "--python-version",
        python_version,
        "--python-platform",
        f"{m.group(2)}-manylinux_2_{m.group(1)}",
    ]
    out = run(argv, f"resolving milarun's dependencies for Python {python_version} on {platform}")
    lacking, held = [], []
    for line in out.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name = canonicalize_name(Requirement(line).name)
            (held if name in image else lacking).append(line)
    return lacking, held


def build(dest, python_version, platform, image_path):
    """Gather the wheels into ``dest`` (which must not exist, or be empty).

    Returns:
        (number of wheels, total size in bytes).

    Raises:
        Refused: see the module docstring.
    """
    dest = Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise Refused(f"{dest}: exists and is not an empty folder (nothing written)")
    platforms = pip_platforms(platform)
    if not re.fullmatch(r"3\.\d+", python_version):
        raise Refused(f"--python-version {python_version!r}: expected 3.N, e.g. 3.12")
    image = read_image(image_path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        wheels = work / "wheels"
        wanted, _ = resolve(declared(), image, python_version, platform, work)
        print(
            f"wheelhouse: {len(wanted)} packages the image lacks: " + ", ".join(wanted), flush=True
        )
        run(
            ["uv", "build", "--wheel", "--quiet", "--out-dir", str(wheels), str(ROOT)]
            if shutil.which("uv")
            else [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "-q",
                "-w",
                str(wheels),
                str(ROOT),
            ],
            "building the milarun wheel",
        )
        argv = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            python_version,
            "--implementation",
            "cp",
            "--dest",
            str(wheels),
            "--quiet",
        ]
        for tag in platforms:
            argv += ["--platform", tag]
        run(argv + wanted, f"downloading wheels for Python {python_version} on {platform}")
        files = sorted(wheels.glob("*.whl"))
        have = {canonicalize_name(f.name.split("-")[0]) for f in files}
        lacking = [w for w in wanted if canonicalize_name(Requirement(w).name) not in have]
        if lacking:
            raise Refused("no wheel for " + ", ".join(lacking))
        wheels.rename(dest) if not dest.exists() else _move_into(wheels, dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    size = sum(f.stat().st_size for f in dest.glob("*.whl"))
    return len(files), size


def _move_into(src, dest):
    for f in src.iterdir():
        os.replace(f, dest / f.name)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--python-version", default="3.12", help="the node's Python, 3.N (default 3.12)"
    )
    parser.add_argument(
        "--platform",
        default="manylinux_2_28_x86_64",
        help="the node's platform tag (default manylinux_2_28_x86_64)",
    )
    parser.add_argument(
        "--image",
        default=str(DEFAULT_IMAGE),
        help="the image's package list (default scripts/image/pytorch-2.11.txt)",
    )
    parser.add_argument(
        "--image-packages",
        action="store_true",
        help="print the image's packages that milarun's dependencies "
        "resolve to (name==version, one a line) and exit; DIR unused",
    )
    parser.add_argument("dir", nargs="?", help="the folder to create")
    args = parser.parse_args(argv)
    try:
        if args.image_packages:
            pip_platforms(args.platform)
            with tempfile.TemporaryDirectory() as work:
                _, held = resolve(
                    declared(),
                    read_image(args.image),
                    args.python_version,
                    args.platform,
                    Path(work),
                )
            print("\n".join(held))
            return 0
        if not args.dir:
            raise Refused("give the folder to create (DIR)")
        count, size = build(args.dir, args.python_version, args.platform, args.image)
    except Refused as exc:
        print(f"wheelhouse: error: {exc}", file=sys.stderr)
        return 2
    print(
        f"wheelhouse: {args.dir}: {count} wheels, {size / 1e6:.1f} MB "
        f"(Python {args.python_version}, {args.platform}); install on the node with: "
        f"bash scripts/install-offline.sh {args.dir}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
