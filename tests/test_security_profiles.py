"""Security, profiles and datasets: hostile profiles, system files and dataroots.

Every case ends the command with one line ``milarun: error: …`` and exit 2
(nothing launched, nothing already built lost): a symlink loop as a profile or
an include; a trailing newline in an anchored schema pattern; a profile that
would make too many jobs or an over-long inherits chain (and resolution stays
linear); exec_prefix placeholders; ``milarun dataset`` with a bad dataroot,
bad sizes, a failing disk, and two builds of one dataset.
"""

import errno
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cli

from milarun import datasets
from milarun.errors import ProfileError, SetupError
from milarun.host.devices import Devices
from milarun.plan import nodes
from milarun.plan.launches import plan_job
from milarun.profile import resolve as profile
from milarun.profile.language import load_profile

TOY = "milarun.models.toy_reg:main"
GPUS = Devices("gpu", [0, 1], cores=16, memory_mib=[81559.0, 40960.0])
SCHEMAS = Path(profile.__file__).parent.parent / "formats" / "schemas"


def one_error_line(err):
    """The message of stderr ``err`` when it is exactly one ``milarun: error:`` line."""
    assert err.count("\n") == 1 and err.startswith("milarun: error: "), err
    assert "Traceback" not in err
    return err[len("milarun: error: ") : -1]


def write(path, content):
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


# --- profiles: symlink loops -----------------------------------------------------------

LOOP = r"(symlink loop|Too many levels of symbolic links)"  # Python < 3.13, then 3.13+


@pytest.mark.parametrize("command", [["profile"], ["jobs", "--dry-run"]])
def test_a_symlink_loop_as_the_profile_is_one_line(tmp_path, capsys, command):
    loop = tmp_path / "loop.json"
    loop.symlink_to("loop.json")
    code, _, err = cli([command[0], loop, *command[1:]], capsys)
    assert code == 2
    assert re.fullmatch(
        rf"{re.escape(str(loop))}: cannot read profile \({LOOP}\)", one_error_line(err)
    )


def test_a_symlink_loop_as_an_include_names_the_including_file(tmp_path, capsys):
    (tmp_path / "loop.json").symlink_to("loop.json")
    (tmp_path / "dir").symlink_to("dir")  # a loop in a folder of the path
    for inc in ("loop.json", "dir/p.json"):
        main_file = write(tmp_path / "main.json", {"include": [inc], "a": {"experiment": TOY}})
        code, _, err = cli(["profile", main_file], capsys)
        assert code == 2
        assert re.fullmatch(
            rf"{re.escape(str(main_file))}: key 'include': cannot read "
            rf"'{re.escape(inc)}' \({LOOP}: .*\)",
            one_error_line(err),
        )


# --- schemas: a trailing newline -------------------------------------------------------


def test_every_anchored_schema_pattern_refuses_a_newline():
    # Python's $ matches before a final "\n" (jsonschema), fastjsonschema's does not:
    # the lookahead makes both, and ECMA-262, refuse it.
    for path in SCHEMAS.glob("*.schema.json"):
        for pattern in re.findall(r'"pattern":\s*("(?:[^"\\]|\\.)*")', path.read_text()):
            pattern = json.loads(pattern)
            if pattern.endswith("$"):
                assert pattern.startswith("^(?!.*\\n)"), (path.name, pattern)
                assert not re.search(pattern, "a\n") and not re.search(pattern, "_a\n")


NODE = {"name": "a", "address": "h", "user": "bench"}


@pytest.mark.parametrize(
    "change,message",
    [
        ({"address": "h\n"}, "nodes.0.address: must be a host name or an IP address"),
        ({"user": "bench\n"}, "nodes.0.user: must be a user name (letters, digits, '_', '.', '-')"),
        ({"name": "a\n"}, "nodes.0.name: job names may hold only letters, digits, '_' and '-'"),
        ({"key": "id\n"}, "nodes.0.key: must be the path of an ssh identity file"),
    ],
    ids=["address", "user", "name", "key"],
)
def test_a_trailing_newline_in_a_system_file_is_one_line(tmp_path, capsys, change, message):
    path = write(tmp_path / "system.json", {"nodes": [{**NODE, **change}]})
    with pytest.raises(SetupError) as exc:
        nodes.load_system(path, Devices("cpu", [0]))
    assert str(exc.value) == f"{path}: {message}"
    # and through the CLI, before anything is launched
    prof = write(tmp_path / "p.json", {"a": {"experiment": TOY}})
    code, _, err = cli(["jobs", prof, "--system", path, "--dry-run"], capsys)
    assert (code, one_error_line(err)) == (2, f"{path}: {message}")


def test_a_trailing_newline_in_a_matrix_axis_or_include_is_one_line(tmp_path):
    path = write(
        tmp_path / "p.json", {"a": {"experiment": TOY, "name": "a-{x}", "matrix": {"x\n": [1]}}}
    )
    with pytest.raises(
        ProfileError,
        match=r"job 'a', key \"matrix.'x\\\\n'\": is not a "
        r"valid axis name",
    ):
        load_profile(path)
    write(tmp_path / "q.json", {"b": {"experiment": TOY}})
    path = write(tmp_path / "p.json", {"include": ["q.json\n"], "a": {"experiment": TOY}})
    with pytest.raises(ProfileError, match=r"key 'include.0': must be a path to a profile"):
        load_profile(path)


# --- profiles: bounds on total work ----------------------------------------------------


@pytest.mark.parametrize(
    "option", [("--time", "10:00\n"), ("--partition", "gpu\n"), ("--account", "acme\n")]
)
def test_a_trailing_newline_in_a_slurm_option_is_refused(option):
    from milarun.launcher.slurm import check_options

    flag, value = option
    kwargs = {"partition": None, "time": None, "account": None}
    kwargs[flag[2:]] = value
    with pytest.raises(SetupError, match=flag):
        check_options(1, None, **kwargs)
    kwargs[flag[2:]] = value.strip()
    check_options(1, None, **kwargs)  # the same value without the newline is fine


def test_when_the_two_schema_engines_disagree_the_document_is_refused(monkeypatch):
    from milarun.formats import jsonfile

    # The fast engine refuses, jsonschema finds nothing: fail closed, never "valid".
    monkeypatch.setattr(jsonfile, "_accepts", lambda schema: lambda value, *rest: False)
    found = jsonfile.first_error("gpu", "common#/$defs/name")
    assert found is not None and "schema" in found[1]


def big_profile(entries):
    """``entries`` entries of a 1,024-point matrix each: 100 of them are 5,120 bytes."""
    d = {
        "*": {"experiment": TOY},
        "_t": {
            "matrix": {
                "a": list(range(4)),
                "b": list(range(4)),
                "c": list(range(8)),
                "d": list(range(8)),
            }
        },
    }
    for i in range(entries):
        d[f"x{i}"] = {"inherits": "_t", "name": f"x{i}-{{a}}{{b}}{{c}}{{d}}"}
    return d


def test_a_5kb_profile_of_102400_jobs_is_refused_before_making_them(tmp_path, capsys, monkeypatch):
    path = tmp_path / "big.json"
    path.write_text(json.dumps(big_profile(100), separators=(",", ":")))
    assert path.stat().st_size == 5120
    made = []
    monkeypatch.setattr(profile, "Job", lambda **kw: made.append(1))
    code, _, err = cli(["profile", path], capsys)
    assert code == 2
    assert one_error_line(err) == (
        f"{path}: job 'x9', key 'matrix': the profile makes more "
        "than 10000 jobs (10240 with this entry's)"
    )
    assert not made  # counted, not built


def test_a_profile_of_10000_jobs_loads(tmp_path):
    d = big_profile(9)
    d.update({f"p{i}": {} for i in range(10_000 - 9 * 1024)})
    jobs = load_profile(write(tmp_path / "max.json", d))
    assert len(jobs) == profile.MAX_JOBS == 10_000


def chain(n):
    c = {"j0": {"experiment": TOY}}
    c.update({f"j{i}": {"inherits": f"j{i - 1}"} for i in range(1, n)})
    return c


def test_a_1500_entry_inherits_chain_is_refused(tmp_path, capsys):
    path = write(tmp_path / "chain.json", chain(1500))
    code, _, err = cli(["profile", path], capsys)
    assert code == 2
    assert one_error_line(err) == (
        f"{path}: job 'j64', key 'inherits': a chain of 65 entries "
        "(j64 → j63 → j62 → … → j0); at most 64"
    )


def test_a_cyclic_chain_longer_than_the_bound_is_refused(tmp_path):
    c = chain(200)
    c["j0"]["inherits"] = "j199"
    with pytest.raises(
        ProfileError,
        match=r"job 'j0', key 'inherits': a chain of more than "
        r"64 entries \(j0 → j199 → j198 → … → j136\)",
    ):
        load_profile(write(tmp_path / "cycle.json", c))


def test_inherits_resolution_is_linear(tmp_path, monkeypatch):
    # a 64-entry chain and 1,500 jobs inheriting its end: each entry is merged once onto
    # its parent's resolved definition (before: every job re-merged its whole chain)
    c = chain(64)
    c.update({f"k{i}": {"inherits": "j62", "description": f"k{i}"} for i in range(1500)})
    calls = []
    real = profile.deep_merge
    monkeypatch.setattr(profile, "deep_merge", lambda a, b: calls.append(1) or real(a, b))
    jobs = load_profile(write(tmp_path / "wide.json", c))
    assert len(jobs) == 1564 and jobs[-1].experiment == TOY
    assert jobs[-1].definition["description"] == "k1499"
    assert len(calls) <= 3 * len(c)


# --- exec_prefix placeholders ----------------------------------------------------------


def test_exec_prefix_placeholders_are_filled_per_launch(tmp_path):
    (job,) = load_profile(
        write(
            tmp_path / "p.json",
            {
                "a": {
                    "experiment": TOY,
                    "partition_scheme": {"type": "gpu-progression"},
                    "exec_prefix": [
                        "taskset-like",
                        "--cpus={cpu_per_gpu}",
                        "--gpus={n_gpu}",
                        "{{raw}}",
                    ],
                }
            },
        )
    )
    assert job.placeholders == ["cpu_per_gpu", "n_gpu"]
    one, two = (
        wave[0]
        for wave in plan_job(job, GPUS, 0, "/out", "/data", python="python", use_cgexec=False)
    )
    at = one.argv.index("taskset-like")
    assert one.argv[at : at + 4] == ["taskset-like", "--cpus=8", "--gpus=1", "{raw}"]
    assert two.argv[at : at + 4] == ["taskset-like", "--cpus=8", "--gpus=2", "{raw}"]
    assert two.placeholders == {"cpu_per_gpu": 8, "n_gpu": 2}


@pytest.mark.parametrize(
    "prefix,message",
    [
        (
            ["nice", "{cpu}"],
            "key 'exec_prefix.1': unknown placeholder {cpu} (known: arch, "
            "cpu_per_gpu, dataroot, gpu_memory_gb, n_gpu, numa_node, numa_remote, outdir)",
        ),
        (["nice", "{device}"], "key 'exec_prefix.1': unknown placeholder {device}"),
        (
            ["nice", "-n{cpu_per_gpu:>99999}"],
            "key 'exec_prefix.1': placeholder {cpu_per_gpu} takes no format spec or conversion",
        ),
        (["nice", "{"], "key 'exec_prefix.1': bad template '{'"),
        (
            ["{dataroot}/bin/nice"],
            "key 'exec_prefix.0': the program '{dataroot}/bin/nice' cannot "
            "hold a placeholder or brace",
        ),
    ],
    ids=["unknown", "device", "spec", "malformed", "program"],
)
def test_a_bad_exec_prefix_placeholder_is_one_line(tmp_path, capsys, prefix, message):
    path = write(tmp_path / "p.json", {"a": {"experiment": TOY, "exec_prefix": prefix}})
    code, _, err = cli(["jobs", path, "--dry-run"], capsys)
    assert code == 2
    assert one_error_line(err).startswith(f"{path}: job 'a', {message}")


# --- datasets --------------------------------------------------------------------------


def test_a_file_as_dataroot_is_one_line(tmp_path, capsys):
    root = write(tmp_path / "root", "not a folder")
    code, _, err = cli(["dataset", "mnist", "-d", root], capsys)
    assert (code, one_error_line(err)) == (2, f"{root}: the dataroot is not a folder")
    code, _, err = cli(["dataset", "mnist", "-d", root / "sub"], capsys)
    assert code == 2
    assert one_error_line(err) == (
        f"dataset mnist: cannot build in {root / 'sub'}: Not a directory ({root / 'sub'})"
    )
    assert root.read_text() == "not a folder"


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["mnist", "--count", "0"],
            "dataset mnist: --count must be an integer from 1 to 10,000,000, not 0",
        ),
        (
            ["mnist", "--count", "-5"],
            "dataset mnist: --count must be an integer from 1 to 10,000,000, not -5",
        ),
        (
            ["mnist", "--count", "100000000000"],
            "dataset mnist: --count must be an integer from 1 to 10,000,000, not 100000000000",
        ),
        (
            ["bsds500", "--image-size", "3"],
            "dataset bsds500: --image-size must be an integer from 16 to 4,096, not 3",
        ),
        (
            ["coco", "--image-size", "1000000"],
            "dataset coco: --image-size must be an integer from 16 to 4,096, not 1000000",
        ),
        (
            ["fake_imagenet", "--count", "2"],
            "dataset fake_imagenet: fake_imagenet needs classes "
            ">= 1 and count >= classes (every class folder must "
            "hold an image)",
        ),
        (["mnist", "--size", "huge"], "dataset mnist: unknown size 'huge'; known: tiny, standard"),
        (
            ["mnist", "--image-size", "32"],
            "dataset mnist: no parameter 'image_size'; known: count, test_count",
        ),
        (["imagenet"], "unknown dataset 'imagenet'; known: "),
    ],
    ids=[
        "count0",
        "negative",
        "huge",
        "tiny-image",
        "huge-image",
        "builder",
        "size",
        "param",
        "name",
    ],
)
def test_bad_sizes_are_one_line_and_stamp_nothing(tmp_path, capsys, args, message):
    code, _, err = cli(["dataset", *args, "-d", tmp_path], capsys)
    assert code == 2
    assert one_error_line(err).startswith(message)
    name = args[0]
    assert not (tmp_path / name / datasets.STAMP).exists()
    assert not (tmp_path / f"{name}.partial").exists()


def fail_open_in(root, err):
    """An ``os.open`` that fails with ``err`` for paths under ``root``."""
    real = os.open

    def fake(path, *args, **kwargs):
        if str(path).startswith(str(root)):
            raise OSError(err, os.strerror(err), str(path))
        return real(path, *args, **kwargs)

    return fake


def test_a_read_only_dataroot_is_one_line(tmp_path, capsys, monkeypatch):
    # as root, chmod does not stop writes: the dataroot's file system refuses them
    monkeypatch.setattr(os, "open", fail_open_in(tmp_path, errno.EROFS))
    code, _, err = cli(["dataset", "mnist", "-d", tmp_path], capsys)
    assert code == 2
    assert one_error_line(err) == (
        f"dataset mnist: cannot build in {tmp_path}: Read-only "
        f"file system ({tmp_path / '.mnist.lock'})"
    )


def test_a_full_disk_is_one_line_and_keeps_the_previous_build(tmp_path, capsys, monkeypatch):
    datasets.prepare("mnist", tmp_path, overrides={"count": 2}, log=lambda *_: None)
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "mnist").rglob("*"))
    from milarun.datasets import mnist

    def full(root, params, seed):
        (root / "some-bytes").write_bytes(b"x" * 4096)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(root / "MNIST"))

    monkeypatch.setattr(mnist, "build", full)
    code, _, err = cli(["dataset", "mnist", "-d", tmp_path, "--count", "3"], capsys)
    assert code == 2
    assert one_error_line(err) == (
        f"dataset mnist: cannot build in {tmp_path}: No space left "
        f"on device ({tmp_path / 'mnist.partial' / 'MNIST'})"
    )
    assert not (tmp_path / "mnist.partial").exists()  # its space given back
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "mnist").rglob("*")) == before
    assert datasets.is_complete(tmp_path, "mnist", overrides={"count": 2})


def test_a_symlink_as_the_lock_file_is_refused(tmp_path, capsys):
    target = tmp_path / "elsewhere"
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / ".mnist.lock").symlink_to(target)
    code, _, err = cli(["dataset", "mnist", "-d", tmp_path / "root"], capsys)
    assert code == 2
    assert "a symlink where milarun writes (refused, not followed)" in one_error_line(err)
    assert not target.exists() and not (tmp_path / "root" / "mnist").exists()


HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def hold_lock(root, name, seconds):
    """A process holding ``root/.name.lock`` for ``seconds`` (another build), once it holds."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(root / f".{name}.lock"), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline() == "held\n"
    return proc


def test_a_second_build_waits_for_the_first(tmp_path):
    holder = hold_lock(tmp_path, "mnist", 120)
    second = subprocess.Popen(
        [sys.executable, "-m", "milarun", "dataset", "mnist", "-d", str(tmp_path), "--count", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first_line = second.stdout.readline()  # printed while the first build holds the lock
        assert not (tmp_path / "mnist").exists() and not (tmp_path / "mnist.partial").exists()
    finally:
        holder.kill()  # the first build ends
        holder.wait()
    rest, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    assert first_line == (
        f"milarun: dataset mnist: another build holds "
        f"{tmp_path}/.mnist.lock; waiting for it (at most 3600 s)\n"
    )
    assert rest.startswith("milarun: dataset mnist (tiny) built in") and rest.count("\n") == 1
    assert datasets.is_complete(tmp_path, "mnist", overrides={"count": 2})


def test_a_build_held_too_long_gives_up_with_one_line(tmp_path, capsys, monkeypatch):
    holder = hold_lock(tmp_path, "mnist", 60)
    try:
        monkeypatch.setattr(datasets, "LOCK_TIMEOUT_S", 0.5)
        code, out, err = cli(["dataset", "mnist", "-d", tmp_path], capsys)
    finally:
        holder.kill()
        holder.wait()
    assert code == 2
    assert out == (
        f"milarun: dataset mnist: another build holds {tmp_path}/.mnist.lock; "
        "waiting for it (at most 0.5 s)\n"
    )
    assert one_error_line(err) == (
        f"dataset mnist: another build still holds "
        f"{tmp_path}/.mnist.lock after 0.5 s; run this again once "
        "it ends"
    )
    assert not (tmp_path / "mnist").exists()


def test_a_bulky_bad_default_fails_at_the_first_job_without_copying_it_for_each(
    tmp_path, monkeypatch
):
    # counting the jobs reads the matrices alone: the bulky '*' is merged into the
    # first job, which is refused, not into all 500 entries first
    d = {"*": {"experiment": TOY, "junk": {str(i): [i] for i in range(2000)}}}
    d.update({f"p{i}": {} for i in range(500)})
    calls = []
    real = profile.deep_merge
    monkeypatch.setattr(
        profile, "deep_merge", lambda a, b: calls.append("junk" in a or "junk" in b) or real(a, b)
    )
    with pytest.raises(ProfileError, match=r"job 'p0', key 'junk': unknown key"):
        load_profile(write(tmp_path / "bulky.json", d))
    assert sum(calls) <= 3  # "*" merged, checked, and merged into p0
