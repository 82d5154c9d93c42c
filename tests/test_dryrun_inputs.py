"""Profile inputs that must stop ``milarun jobs`` and its dry run alike: a
cgroup template climbing out of the cgroup tree (whatever --no-cgexec says) and an
experiment naming a function its module lacks, checked without importing the module."""

import json
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT

from milarun.cli import main
from milarun.host import isolation
from milarun.profile.experiment import check_experiment

TEST = {
    "experiment": "milarun.models.toy_reg:main",
    "partition_scheme": {"type": "per-gpu", "cgroup": "cpuset,memory:student{device}"},
}


def run(argv, capsys):
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in argv])
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def jobs(tmp_path, capsys, job, *extra):
    """Dry run then real run of a profile holding ``job``: [(exit status, stderr)] of each."""
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"a": job}))
    (tmp_path / "data").mkdir(exist_ok=True)
    args = [
        "jobs",
        path,
        "--cpu-slots",
        "1",
        "-d",
        tmp_path / "data",
        "-o",
        tmp_path / "out",
        *extra,
    ]
    dry = run(args + ["--dry-run"], capsys)
    real = run(args, capsys)
    assert not (tmp_path / "out").exists()  # refused before anything was made
    return [(code, err) for code, _, err in (dry, real)]


@pytest.mark.parametrize(
    "template, problem",
    [
        ("cpuset:../../../x{device}", "no '.' or '..' part"),
        ("cpuset,memory:student{device}/../../etc", "no '.' or '..' part"),
        ("cpuset:./s{device}", "no '.' or '..' part"),
        ("cpuset:/student{device}", "no '/' at the start"),
        ("cpuset:a//s{device}", "no empty part"),
        ("cpuset:s{device}/", "no empty part"),
        ("CPU,memory:s{device}", "the controllers must be lower-case names"),
    ],
)
@pytest.mark.parametrize("no_cgexec", [False, True])
def test_a_cgroup_template_leaving_the_tree_is_one_line_in_both_runs(
    tmp_path, capsys, template, problem, no_cgexec
):
    job = {**TEST, "partition_scheme": {"type": "per-gpu", "cgroup": template}}
    results = jobs(tmp_path, capsys, job, *(["--no-cgexec"] if no_cgexec else []))
    for code, err in results:
        assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert err.startswith(
            f"milarun: error: {tmp_path / 'p.json'}: job 'a', key "
            f"'partition_scheme.cgroup': {template!r}: "
        )
        assert problem in err


@pytest.mark.parametrize("spec", ["cpuset,memory:student0", "memory:students/s0", "cpu:a.b-c_d/e"])
def test_plain_groups_pass(spec):
    assert isolation.check_group_spec(spec) is None


@pytest.mark.parametrize(
    "experiment, problem",
    [
        ("sys:nosuch", "module 'sys' has no function 'nosuch'"),
        ("os:path", "module 'os' has no function 'path'"),  # a module, not a function
        (
            "milarun.models.toy_reg:nosuch",
            "module 'milarun.models.toy_reg' has no function 'nosuch'",
        ),
        ("no_such_module_xyz:main", "cannot import module 'no_such_module_xyz'"),
    ],
)
def test_an_experiment_without_its_function_is_one_line_in_both_runs(
    tmp_path, capsys, experiment, problem
):
    for code, err in jobs(tmp_path, capsys, {**TEST, "experiment": experiment}):
        assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert err.startswith(
            f"milarun: error: {tmp_path / 'p.json'}: job 'a', key 'experiment': {problem}"
        )


def test_the_function_is_found_in_the_source_without_importing(tmp_path, monkeypatch):
    pkg = tmp_path / "wl_pkg"
    pkg.mkdir()
    # importing the package or the module would fail the test: it raises
    (pkg / "__init__.py").write_text("raise RuntimeError('imported wl_pkg')\n")
    (pkg / "mod.py").write_text(
        textwrap.dedent("""\
        raise RuntimeError("imported wl_pkg.mod")
        def main(exp, argv): pass
        alias = main
        try:
            from fast import tuned
        except ImportError:
            def tuned(exp, argv): pass
        class Runner: pass
        """)
    )
    (tmp_path / "star.py").write_text("from os.path import *\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for fn in ("main", "alias", "tuned", "Runner"):
        assert check_experiment(f"wl_pkg.mod:{fn}") is None, fn
    assert check_experiment("wl_pkg.mod:nosuch") == "module 'wl_pkg.mod' has no function 'nosuch'"
    assert check_experiment("star:anything") is None  # a star import: only an import knows
    assert "wl_pkg" not in sys.modules and "wl_pkg.mod" not in sys.modules


def test_checking_a_submodule_of_torch_does_not_import_torch():
    # a fresh interpreter: this one may have imported torch for other tests
    code = (
        "import sys; from milarun.profile.experiment import check_experiment as c; "
        "print(c('torch.nn.functional:relu'), c('torch.nn.functional:nosuch_fn'), "
        "'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == ("None module 'torch.nn.functional' has no function 'nosuch_fn' False")
