"""The vendor's side of a sealed bundle (docs/tender.md): a node's hardware identity (fake
sysfs, fake NVML and amdsmi), every node's identity in the session file, ``--resume``
continuing the chain, ``milarun seal`` (bundle.json, weights in the chain, the Ed25519
signature) and its refusals, ``milarun keygen``."""

import errno
import json
import shutil
import socket
import subprocess
import sys
import types
from pathlib import Path

import pytest
from test_accel import fake_amdsmi, fake_nvml
from test_monitor import fake_pynvml

from milarun.cli import main
from milarun.formats.bundle import read_bundle
from milarun.formats.manifest import check_chain, head_of, manifest_path, read_manifest
from milarun.host import identity as identity_mod
from milarun.host.accel.amd import AMDBackend
from milarun.host.accel.nvidia import NvidiaBackend
from milarun.host.devices import Devices
from milarun.launcher import identities
from milarun.launcher.session import OutdirLock
from milarun.plan.nodes import Cluster, Node
from milarun.verify import keys
from milarun.verify.seal import SealError, seal

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ identity


def write(path, text):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def fake_sysfs(root):
    """DMI (board serial root-only), four interfaces (one real NIC, lo, a bridge without
    a device, a device with an all-zero MAC), cpuinfo and meminfo."""
    dmi = root / "sys/class/dmi/id"
    write(dmi / "product_serial", "SYS-4242\n")
    write(dmi / "board_serial", "BRD-7\n")
    write(dmi / "product_uuid", "4c4c4544-0042-3510\n")
    for name, mac, device in (
        ("eth0", "0C:42:A1:00:00:01", True),
        ("lo", "00:00:00:00:00:00", False),
        ("docker0", "02:42:ac:11:00:02", False),
        ("ib0", "00:00:00:00:00:00", True),
    ):
        write(root / "sys/class/net" / name / "address", mac + "\n")
        if device:
            (root / "sys/class/net" / name / "device").mkdir()
    write(root / "proc/cpuinfo", "processor\t: 0\nmodel name\t: Fake EPYC 9654\n")
    write(root / "proc/meminfo", "MemTotal:       2097152 kB\nMemFree: 1 kB\n")
    return root


def serial_nvml():
    """test_monitor's fake pynvml (2 GPUs) with PCI info and serials; GPU 1's serial
    raises NotSupported (a GeForce board)."""
    nv = fake_pynvml(count=2)

    def serial(h):
        if h.index == 1:
            raise RuntimeError("Not Supported")
        return f"132032000{h.index}".encode()

    nv.nvmlDeviceGetSerial = serial
    nv.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(
        busId=f"00000000:{0x3B + h.index:02X}:00.0"
    )
    return nv


@pytest.fixture
def no_visibility(monkeypatch):
    for var in ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "MILARUN_BACKEND"):
        monkeypatch.delenv(var, raising=False)


def test_identity_from_a_fake_sysfs_and_nvml(tmp_path, monkeypatch, no_visibility):
    root = fake_sysfs(tmp_path)
    board = root / "sys/class/dmi/id/board_serial"
    read_bytes = Path.read_bytes

    def denied(self):  # the tests run as root: EACCES is what a user gets
        if self == board:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return read_bytes(self)

    monkeypatch.setattr(Path, "read_bytes", denied)
    ident = identity_mod.identity(
        root, options={"nvidia": {"pynvml": serial_nvml(), "root": str(root)}}
    )
    assert ident["hostname"] == socket.gethostname()
    assert ident["dmi"] == {
        "product_serial": "SYS-4242",
        "board_serial": "unreadable (not root)",
        "product_uuid": "4c4c4544-0042-3510",
    }
    assert ident["nics"] == {"eth0": "0c:42:a1:00:00:01"}
    assert ident["cpu_model"] == "Fake EPYC 9654" and ident["memory_mib"] == 2048
    assert ident["gpus"] == [
        {
            "backend": "nvidia",
            "index": 0,
            "name": "Fake GPU 0",
            "uuid": "GPU-0aaa-0",
            "serial": "1320320000",
            "pci_bus_id": "0000:3b:00.0",
        },
        {
            "backend": "nvidia",
            "index": 1,
            "name": "Fake GPU 1",
            "uuid": "GPU-1aaa-1",
            "serial": "unreadable (RuntimeError: Not Supported)",
            "pci_bus_id": "0000:3c:00.0",
        },
    ]
    assert identity_mod.serials(ident) == ["1320320000"]
    json.dumps(ident, allow_nan=False)


def test_each_nvml_reading_fails_on_its_own(no_visibility):
    nv = serial_nvml()
    name = nv.nvmlDeviceGetName

    def no_name(h):
        if h.index == 1:
            raise RuntimeError("Unknown Error")
        return name(h)

    nv.nvmlDeviceGetName = no_name
    backend = NvidiaBackend(pynvml=nv)
    assert backend.identity(backend.discover()[1]) == {
        "name": "unreadable (RuntimeError: Unknown Error)",
        "uuid": "GPU-1aaa-1",
        "serial": "unreadable (RuntimeError: Not Supported)",
        "pci_bus_id": "0000:3c:00.0",
    }


def test_a_mig_instance_gives_its_gpus_serial_and_uuid(no_visibility):
    nv = fake_nvml(mig_on=(1,))
    nv.nvmlDeviceGetSerial = lambda h: f"SN{h.index}" if h.mig is None else 1 / 0
    backend = NvidiaBackend(pynvml=nv)
    mig = [d for d in backend.discover() if d.parent == 1][0]
    assert backend.identity(mig) == {
        "name": "A100 MIG 1g.10gb",
        "uuid": "MIG-10aa",
        "serial": "SN1",
        "pci_bus_id": "0000:3c:00.0",
        "gpu_uuid": "GPU-1bb",
    }


def test_identity_without_dmi_or_gpus(tmp_path, no_visibility):
    nv = fake_pynvml(count=0)
    ident = identity_mod.identity(
        tmp_path,
        options={
            "nvidia": {"pynvml": nv},
            "amd": {"amdsmi": fake_amdsmi(0)},
            "intel": {"root": str(tmp_path)},
        },
    )
    assert ident["gpus"] == [] and ident["nics"] == {}
    assert ident["dmi"] == dict.fromkeys(identity_mod.DMI_KEYS)


def test_amd_identity_reads_each_serial_on_its_own(no_visibility):
    smi = fake_amdsmi(2)
    smi.amdsmi_get_gpu_board_info = lambda h: {"product_serial": f"PCB-{h}", "model_number": "x"}

    def asic(h):
        if h == "h1":
            raise RuntimeError("AMDSMI_STATUS_NOT_SUPPORTED")
        return {"market_name": "AMD Instinct MI300X", "asic_serial": "0xABCD"}

    smi.amdsmi_get_gpu_asic_info = asic
    backend = AMDBackend(amdsmi=smi)
    first, second = [backend.identity(d) for d in backend.discover()]
    assert first == {
        "name": "AMD Instinct MI300X",
        "uuid": "uuid-h0",
        "serial": "PCB-h0",
        "asic_serial": "0xABCD",
        "pci_bus_id": "0000:c0:00.0",
    }
    assert second["serial"] == "PCB-h1" and second["uuid"] == "uuid-h1"
    assert second["asic_serial"] == "unreadable (RuntimeError: AMDSMI_STATUS_NOT_SUPPORTED)"


def test_a_record_carries_the_serial_of_its_gpus(monkeypatch, no_visibility):
    from milarun.bench import experiment

    monkeypatch.setitem(sys.modules, "pynvml", serial_nvml())
    monkeypatch.setenv("MILARUN_BACKEND", "nvidia")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1aaa-1")
    gpus, _ = experiment._gpus()
    assert [(g["uuid"], g["serial"]) for g in gpus] == [
        ("GPU-1aaa-1", "unreadable (RuntimeError: Not Supported)")
    ]


def test_python_m_identity_prints_one_json_object():
    out = subprocess.run(
        [sys.executable, "-m", "milarun.host.identity"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    ident = json.loads(out.stdout)
    assert ident["format"] == "milarun-identity" and ident["hostname"] == socket.gethostname()


def _script(path, body):
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def test_every_node_answers_through_the_transport_and_is_read_as_data(tmp_path):
    # a "local" cluster of two nodes runs the argv once per node, as srun or ssh would
    cluster = Cluster("local", [Node("a", main=True), Node("b")], Devices("cpu", [0]))
    found = identities.collect(cluster)
    assert set(found) == {"a", "b"}
    assert all(v["format"] == "milarun-identity" for v in found.values())
    for body, error in (
        ("echo 'not json'", "malformed answer"),
        ('echo \'{"format": "other"}\'', "not a milarun identity"),
        ('echo \'{"a": 1, "a": 2}\'', "malformed answer"),
        ("echo gone >&2; exit 3", "exit status 3: gone"),
        ("true", "no answer on standard output"),
    ):
        cluster.python = _script(tmp_path / "py", body)
        found = identities.collect(cluster)
        assert set(found) == {"a", "b"}
        assert all(error in v["error"] for v in found.values()), found
    too_big = b'{"format": "milarun-identity", "pad": "' + b"x" * (2 * 2**20) + b'"}'
    assert identities.parse_answer(too_big, "a") == {
        "error": f"answer larger than {identity_mod.MAX_IDENTITY_BYTES} bytes"
    }
    cluster.python = _script(tmp_path / "py", "sleep 30")
    assert identities.collect(cluster, timeout=0.5)["b"] == {"error": "no answer within 0.5 s"}


# ---------------------------------------------------- a real folder, resumed

FLAKY = {
    "experiment": "milarun.models.faults:flaky",
    "partition_scheme": {"type": "per-gpu"},
    "arguments": {"max-count": 3, "warmup": 0, "sample-duration": 0.05},
}
OK = {
    "experiment": "milarun.models.faults:crawl",
    "partition_scheme": {"type": "per-gpu"},
    "arguments": {"max-count": 3, "warmup": 0, "sample-duration": 0.05, "step-seconds": 0.01},
}


def run_jobs(profile, data, *args):
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "milarun",
            "jobs",
            str(profile),
            "--no-cgexec",
            "--cpu-slots",
            "1",
            "-d",
            str(data),
            *args,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="session")
def resumed(tmp_path_factory):
    """A results folder of two sessions: the first with a failing test, the second a
    ``--resume`` that passes it."""
    base = tmp_path_factory.mktemp("resumed")
    flag = base / "flag"
    profile = base / "p.json"
    profile.write_text(
        json.dumps(
            {
                "ok": OK,
                "flaky": {**FLAKY, "arguments": {**FLAKY["arguments"], "pass-if": str(flag)}},
            }
        )
    )
    out = base / "out"
    first = run_jobs(profile, base, "-o", str(out))
    assert first.returncode == 1 and "1 passed, 1 failed" in first.stdout, first.stderr
    heads = [first.stderr.split("manifest head ")[1].split()[0]]
    flag.write_text("")
    again = run_jobs(profile, base, "--resume", str(out))
    assert again.returncode == 0, again.stderr
    heads.append(again.stderr.split("manifest head ")[1].split()[0])
    return out, heads


@pytest.fixture
def folder(resumed, tmp_path):
    """A copy of the resumed folder, to seal or spoil."""
    out = tmp_path / "out"
    shutil.copytree(resumed[0], out, symlinks=True)
    return out


def test_the_session_file_holds_every_nodes_identity_and_resume_continues_the_chain(resumed):
    out, heads = resumed
    session = json.loads((out / ".milarun/session.json").read_text())
    assert [s["resume"] for s in session["sessions"]] == [False, True]
    for s in session["sessions"]:
        ((node, ident),) = s["identity"].items()
        assert node == socket.gethostname() and ident["format"] == "milarun-identity"
    entries = read_manifest(manifest_path(out))
    assert check_chain(entries) == []
    ids = [s["id"] for s in session["sessions"]]
    assert [e["session"] for e in entries if e["kind"] == "session"] == ids
    assert [e["session"] for e in entries if e["kind"] == "end"] == ids
    # the head printed at the end of each session is its end entry's hash
    assert [e["hash"] for e in entries if e["kind"] == "end"] == heads
    assert head_of(entries) == heads[-1]
    records = [
        (e["session"], e["launch"]["name"], e["success"]) for e in entries if e["kind"] == "record"
    ]
    assert sorted(records) == sorted(
        [(ids[0], "p.ok", True), (ids[0], "p.flaky", False), (ids[1], "p.flaky", True)]
    )


# ------------------------------------------------------------------ seal


def test_seal_writes_a_bundle_whose_head_is_the_manifests(folder, capsys):
    bundle = seal(folder)
    assert read_bundle(folder / "bundle.json") == bundle  # valid against its schema
    entries = read_manifest(manifest_path(folder))
    assert bundle["head"] == head_of(entries) and bundle["entries"] == len(entries)
    session = json.loads((folder / ".milarun/session.json").read_text())
    assert bundle["sessions"] == [s["id"] for s in session["sessions"]]
    assert bundle["identity"] == session["sessions"][0]["identity"]
    assert bundle["profile_sha256"] == session["invocation"]["profile_sha256"]
    assert bundle["weights_sha256"] is None and "weights" not in bundle
    assert not (folder / "bundle.json.sig").exists()
    printed = capsys.readouterr().out
    assert f"manifest head {bundle['head']} ({len(entries)} entries)" in printed
    assert str(folder / "bundle.json") in printed


def test_seal_enters_the_weights_in_the_chain_first(folder):
    before = read_manifest(manifest_path(folder))
    weights = ROOT / "weights" / "cpu.json"
    bundle = seal(folder, weights=weights)
    entries = read_manifest(manifest_path(folder))
    assert check_chain(entries) == [] and entries[:-1] == before
    last = entries[-1]
    assert (last["kind"], last["path"], last["session"]) == (
        "weights",
        ".milarun/weights.json",
        before[-1]["session"],
    )
    assert (folder / ".milarun/weights.json").read_bytes() == weights.read_bytes()
    assert bundle["head"] == last["hash"] and bundle["entries"] == len(entries)
    assert bundle["weights_sha256"] == last["sha256"] and bundle["weights"] == last["path"]


def test_seal_signs_the_bundles_exact_bytes(folder, tmp_path):
    private, public = tmp_path / "k.pem", tmp_path / "k.pub"
    assert cli(["keygen", private, public]) == 0
    seal(folder, sign=private)
    data = (folder / "bundle.json").read_bytes()
    sig = folder / "bundle.json.sig"
    assert keys.check_signature(data, sig, public) == (
        True,
        "signature valid under the given public key",
    )
    edited = data.replace(b'"entries": ', b'"entries": 1')
    assert keys.check_signature(edited, sig, public)[0] is False
    other_priv, other_pub = tmp_path / "o.pem", tmp_path / "o.pub"
    keys.keygen(other_priv, other_pub)
    assert keys.check_signature(data, sig, other_pub)[0] is False


def cli(argv):
    """``milarun ARGV`` in this process; its exit status."""
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in argv])
    return exc.value.code


def _cli_error(capsys, argv):
    code = cli(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_seal_refuses_a_folder_without_manifest(tmp_path, capsys):
    (tmp_path / "r").mkdir()
    err = _cli_error(capsys, ["seal", str(tmp_path / "r")])
    assert err.startswith(f"milarun: error: {tmp_path / 'r'}: no manifest")
    assert not (tmp_path / "r/bundle.json").exists()


def test_seal_refuses_a_broken_chain(folder, capsys):
    path = manifest_path(folder)
    lines = path.read_text().splitlines(keepends=True)
    entry = json.loads(lines[3])
    entry["bytes"] += 1  # one entry edited, its hash left alone
    lines[3] = json.dumps(entry, sort_keys=True, separators=(",", ":")) + "\n"
    path.write_text("".join(lines))
    err = _cli_error(capsys, ["seal", str(folder)])
    assert "the chain is broken: manifest entry 3" in err and "hash does not match" in err
    assert not (folder / "bundle.json").exists()


def test_seal_refuses_a_folder_already_sealed_and_never_overwrites(folder, capsys):
    seal(folder)
    capsys.readouterr()
    before = (folder / "bundle.json").read_bytes()
    err = _cli_error(capsys, ["seal", str(folder)])
    assert err == (
        f"milarun: error: {folder / 'bundle.json'}: already sealed; seal never "
        "overwrites a bundle: remove bundle.json (and bundle.json.sig) to seal again"
    )
    assert (folder / "bundle.json").read_bytes() == before


def test_seal_refuses_while_a_session_runs(folder):
    with OutdirLock(folder):
        with pytest.raises(SealError, match="a milarun jobs session is still writing here"):
            seal(folder)
    assert not (folder / "bundle.json").exists()


@pytest.mark.parametrize("where", ["weights copy", "bundle"])
def test_seal_on_a_full_disk_is_one_line_not_a_traceback(folder, capsys, monkeypatch, where):
    import milarun.verify.seal as seal_mod  # why: the write to make fail is its own

    real = seal_mod.write_atomic

    def full(path, data, *args, **kwargs):
        if where == "bundle" and not str(path).endswith("bundle.json"):
            return real(path, data, *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(seal_mod, "write_atomic", full)
    err = _cli_error(capsys, ["seal", str(folder), "--weights", str(ROOT / "weights/cpu.json")])
    assert "No space left on device" in err and "nothing was sealed" in err
    assert not (folder / "bundle.json").exists()
    monkeypatch.setattr(seal_mod, "write_atomic", real)
    assert seal(folder, weights=ROOT / "weights/cpu.json")["entries"]  # space back: it seals


def test_seal_refuses_a_session_file_changed_after_its_entry(folder):
    path = folder / ".milarun/session.json"
    data = json.loads(path.read_text())
    data["invocation"]["no_cgexec"] = False  # hiding an override
    path.write_text(json.dumps(data))
    with pytest.raises(SealError, match="the session file is not the one the manifest"):
        seal(folder)


def test_seal_refuses_a_bad_weights_file_or_key_before_writing(folder, tmp_path, capsys):
    bad = write(tmp_path / "w.json", '{"cpu.toy_reg": {"weight": "heavy"}}')
    err = _cli_error(capsys, ["seal", str(folder), "--weights", str(bad)])
    assert err.startswith(f"milarun: error: {bad}: cpu.toy_reg")
    key = write(tmp_path / "k.pem", "not a key")
    err = _cli_error(capsys, ["seal", str(folder), "--sign", str(key)])
    assert err.startswith(f"milarun: error: {key}: not an unencrypted PEM private key")
    assert not (folder / "bundle.json").exists() and not (folder / ".milarun/weights.json").exists()
    assert read_manifest(manifest_path(folder))[-1]["kind"] == "end"


def test_keygen_never_overwrites_a_key(tmp_path, capsys):
    private, public = tmp_path / "k.pem", tmp_path / "k.pub"
    assert cli(["keygen", private, public]) == 0
    assert private.stat().st_mode & 0o777 == 0o600
    before = private.read_bytes(), public.read_bytes()
    capsys.readouterr()
    err = _cli_error(capsys, ["keygen", str(private), str(tmp_path / "new.pub")])
    assert err == (
        f"milarun: error: {private}: exists already; milarun keygen never overwrites a key"
    )
    assert (private.read_bytes(), public.read_bytes()) == before
    assert not (tmp_path / "new.pub").exists()
