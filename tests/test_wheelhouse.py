"""Installing into a GPU node's own PyTorch, offline: the image's package list, the
wheelhouse's list (scripts/wheelhouse.py) and scripts/install-offline.sh.

The wheelhouse's download needs a package index and is rehearsed by
scripts/dev/rehearse-image.sh; here, what needs none: that the lists cover every
import, the refusals of bad input, and install-offline.sh on wheels made by the test.
"""

import ast
import importlib.util
import os
import subprocess
import sys
import zipfile
from importlib import metadata

import pytest
from conftest import ROOT
from packaging.utils import canonicalize_name

IMAGE = ROOT / "scripts" / "image" / "pytorch-2.11.txt"
INSTALL = ROOT / "scripts" / "install-offline.sh"

#: Modules milarun imports only where present, and why they are no dependency.
OPTIONAL = {"amdsmi": "ships with ROCm, for AMD GPUs (docs/vendors.md)"}


def _load_wheelhouse():
    spec = importlib.util.spec_from_file_location("wheelhouse", ROOT / "scripts" / "wheelhouse.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


wheelhouse = _load_wheelhouse()


def imported_distributions():
    """Every third-party distribution a module of milarun/ imports: name -> a file."""
    dists = metadata.packages_distributions()
    out = {}
    for path in sorted((ROOT / "milarun").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top == "milarun" or top in OPTIONAL:
                    continue
                assert top in dists, f"{path}: imports {top}, which no installed package provides"
                for dist in dists[top]:
                    out.setdefault(canonicalize_name(dist), str(path.relative_to(ROOT)))
    return out


def test_every_import_is_in_the_image_or_the_wheelhouse():
    image = wheelhouse.read_image(IMAGE)
    declared = wheelhouse.declared()
    wheels = set(wheelhouse.not_in_image(declared, image))
    names = {canonicalize_name(r.name) for r in declared}
    imported = imported_distributions()
    assert {"torch", "numpy", "coleo", "pillow"} <= set(imported)
    for dist, where in imported.items():
        assert dist in names, f"{where} imports {dist}, which pyproject.toml does not declare"
        assert dist in image or dist in wheels, f"{dist} ({where}): in neither list"


def test_the_wheelhouse_holds_what_the_image_lacks_and_never_its_torch():
    image = wheelhouse.read_image(IMAGE)
    wheels = wheelhouse.not_in_image(wheelhouse.declared(), image)
    # The packages such an image was seen to lack (docs/setup.md).
    assert {
        "coleo",
        "jsonschema",
        "fastjsonschema",
        "orjson",
        "diffusers",
        "gymnasium",
        "pycocotools",
        "cryptography",
    } <= set(wheels)
    assert not {"torch", "torchvision", "numpy", "transformers", "pillow"} & set(wheels)


def test_the_images_torch_is_one_milarun_supports():
    image = wheelhouse.read_image(IMAGE)
    supported = {canonicalize_name(r.name): r for r in wheelhouse.declared()}
    for name in ("torch", "torchvision", "transformers", "tokenizers", "lightning"):
        pinned = str(image[name].specifier).removeprefix("==")
        assert supported[name].specifier.contains(pinned), (name, pinned)


def test_pip_platforms_name_every_older_glibc():
    tags = wheelhouse.pip_platforms("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags
    assert "manylinux2014_x86_64" in tags and "manylinux_2_29_x86_64" not in tags


@pytest.mark.parametrize(
    "args, message",
    [
        (["--platform", "win_amd64"], "--platform 'win_amd64': expected manylinux_2_N_x86_64"),
        (["--platform", "manylinux_2_12_x86_64"], "glibc 2.12 is older than any PyTorch"),
        (["--python-version", "three"], "--python-version 'three': expected 3.N"),
        (["--image", "BAD"], "bad.txt:3: not a package requirement"),
        (["--image", "MISSING"], "none.txt: cannot read the image list"),
        (["FULL"], "exists and is not an empty folder"),
    ],
)
def test_wheelhouse_bad_input_is_one_line(tmp_path, capsys, args, message):
    (tmp_path / "bad.txt").write_text("# image\ntorch==2.11.0\ntorch ==> 2\n")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.whl").write_text("x")
    subst = {
        "BAD": str(tmp_path / "bad.txt"),
        "MISSING": str(tmp_path / "none.txt"),
        "FULL": str(tmp_path / "full"),
    }
    args = [subst.get(a, a) for a in args] + ([] if "FULL" in args else [str(tmp_path / "wheels")])
    assert wheelhouse.main(args) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("wheelhouse: error: ") and message in err[0], err
    assert not (tmp_path / "wheels").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt", "full"]
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["keep.whl"]


# --------------------------------------------------------------------- install-offline.sh


def make_wheel(folder, name, version, requires=()):
    """A minimal pure-Python wheel: one module ``name`` with ``VERSION``."""
    dist = f"{name}-{version}"
    files = {
        f"{name}.py": f"VERSION = {version!r}\n",
        f"{dist}.dist-info/METADATA": "Metadata-Version: 2.1\n"
        f"Name: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist}.dist-info/RECORD"] = (
        "".join(f"{f},,\n" for f in files) + f"{dist}.dist-info/RECORD,,\n"
    )
    path = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for f, text in files.items():
            z.writestr(f, text)
    return path


@pytest.fixture(scope="module")
def image_env(tmp_path_factory):
    """A virtual environment with pip, standing for the image: ``fakebase`` 1.0 is its
    "torch"."""
    base = tmp_path_factory.mktemp("image")
    subprocess.run([sys.executable, "-m", "venv", str(base / "venv")], check=True)
    python = base / "venv" / "bin" / "python"
    wheel = make_wheel(base, "fakebase", "1.0")
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-index", str(wheel)],
        check=True,
        env=_pip_env({}),
    )
    return python


def _pip_env(extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "PYTHONPATH"}
    env.update(
        PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", **extra
    )
    return env


def install(python, wheels, *args, env=None):
    return subprocess.run(
        ["bash", str(INSTALL), *args, str(wheels)],
        capture_output=True,
        text=True,
        env=_pip_env({"PYTHON": str(python), **(env or {})}),
        timeout=300,
    )


def has(python, name, path=None):
    """Whether ``python`` imports the test's module ``name`` (not the checkout's milarun:
    run outside it)."""
    proc = subprocess.run(
        [python, "-c", f"import {name}; print({name}.VERSION)"],
        capture_output=True,
        cwd=python.parent,
        env=_pip_env({"PYTHONPATH": str(path)} if path else {}),
    )
    return proc.returncode == 0


@pytest.fixture
def wheels(tmp_path, image_env):
    folder = tmp_path / "wheels"
    folder.mkdir()
    yield folder
    subprocess.run(
        [image_env, "-m", "pip", "uninstall", "-y", "-q", "milarun", "fakedep", "fakedeeper"],
        capture_output=True,
        env=_pip_env({}),
    )


def test_install_offline_installs_what_the_image_lacks_and_keeps_its_base(image_env, wheels):
    make_wheel(wheels, "milarun", "0.1.0", ["fakebase>=1,<2", "fakedep>=1"])
    make_wheel(wheels, "fakedep", "1.0")
    make_wheel(wheels, "fakebase", "1.5")  # offered, never taken: the image's is in range
    proc = install(image_env, wheels)
    assert proc.returncode == 0, proc.stderr
    assert "installing 2 wheels" in proc.stdout and "milarun fakedep" in proc.stdout
    assert has(image_env, "milarun") and has(image_env, "fakedep")
    version = subprocess.run(
        [image_env, "-c", "import fakebase; print(fakebase.VERSION)"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert version == "1.0"
    again = install(image_env, wheels)  # all there: nothing to do, not an error
    assert again.returncode == 0 and "nothing to install" in again.stdout, again.stderr


@pytest.mark.parametrize(
    "requires, extra, message",
    [
        (
            ["fakebase>=2"],
            [],
            "fakebase 1.0 is installed; milarun supports fakebase>=2; nothing installed",
        ),
        (["fakedep"], [], "fakedep is neither installed nor in"),
        (["fakedep"], [("fakedep", "1.0", ["fakedeeper"])], "nothing installed"),
    ],
)
def test_install_offline_refuses_before_installing_anything(
    image_env, wheels, requires, extra, message
):
    make_wheel(wheels, "milarun", "0.1.0", requires)
    for name, version, reqs in extra:
        make_wheel(wheels, name, version, reqs)
    proc = install(image_env, wheels)
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("install-offline: error: "), lines
    assert message in lines[0]
    assert not has(image_env, "milarun") and not has(image_env, "fakedep")


def test_install_offline_into_a_target_folder(image_env, wheels, tmp_path):
    make_wheel(wheels, "milarun", "0.1.0", ["fakebase>=1", "fakedep"])
    make_wheel(wheels, "fakedep", "1.0")
    target = tmp_path / "site"
    proc = install(image_env, wheels, "--target", str(target))
    assert proc.returncode == 0, proc.stderr
    assert f"export PYTHONPATH={target}" in proc.stdout
    assert not has(image_env, "milarun")
    assert has(image_env, "milarun", target) and has(image_env, "fakedep", target)
    assert not [p for p in target.iterdir() if p.name.startswith(".install")]


def test_install_offline_bad_arguments(tmp_path, image_env):
    for args, message in [
        ([str(tmp_path / "none")], "no such folder"),
        ([str(tmp_path)], "expected one milarun-*.whl, found 0"),
    ]:
        proc = subprocess.run(
            ["bash", str(INSTALL), *args],
            capture_output=True,
            text=True,
            env=_pip_env({"PYTHON": str(image_env)}),
        )
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
