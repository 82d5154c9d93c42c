"""The host prescreen (milarun/host/prescreen.py) on fake sysfs/procfs trees and a fake NVML:
each finding ok, not ok and unknown, unreadable files, what ``milarun jobs`` and its dry run
print, ``--prescreen-fatal``, and verify's ``compliance.prescreen`` clause."""

import json
import os
import shutil
import socket
import sys
import types

import pytest
from test_dryrun import run

from milarun.formats.rules import RulesError, read_rules
from milarun.host import identity as identity_mod
from milarun.host import isolation
from milarun.host import prescreen as ps
from milarun.launcher import dryrun, identities
from milarun.verify.check import Bundle, _prescreen_clause, check_compliance
from milarun.verify.verdict import Verdict

GOOD_IB = {"mlx5_0": {"1": ("4: ACTIVE", "400 Gb/sec (4X NDR)", "5: LinkUp")}}


def write(root, rel, text):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def acs_config(control, behind=True):
    """4,096 bytes of a bridge's configuration space whose ACS capability has ``control``:
    after an AER capability at 0x100 (``behind``), or none at all (``control`` None)."""
    config = bytearray(4096)
    config[0:4] = (0x1234_10DE).to_bytes(4, "little")
    at = 0x100
    if behind:  # AER (ID 1, version 2), next at 0x148
        config[at : at + 4] = (0x0001 | 2 << 16 | 0x148 << 20).to_bytes(4, "little")
        at = 0x148
    if control is not None:
        config[at : at + 4] = (0x000D | 1 << 16).to_bytes(4, "little")
        config[at + 6 : at + 8] = control.to_bytes(2, "little")
    return bytes(config)


def fake_tree(
    root,
    cstates=(("POLL", "0"), ("C1", "0"), ("C1E", "0"), ("C6", "1")),
    governors=("performance", "performance"),
    numa="0",
    thp="always [madvise] never",
    osrelease="6.8.0-45-generic",
    iommu_types=("identity", "identity"),
    iommu_units=("dmar0",),
    cmdline="BOOT_IMAGE=/vmlinuz ro quiet iommu=pt",
    ib=None,
    bridges=None,
):
    """A node's sysfs and procfs under ``root``: by default every finding as expected.
    ``bridges``: ``{address: config bytes}`` of PCI bridges (default: two, ACS off)."""
    for n, gov in enumerate(governors):
        cpu = f"sys/devices/system/cpu/cpu{n}"
        write(root, f"{cpu}/cpufreq/scaling_governor", gov + "\n")
        for m, (label, disable) in enumerate(cstates):
            write(root, f"{cpu}/cpuidle/state{m}/name", label + "\n")
            write(root, f"{cpu}/cpuidle/state{m}/disable", disable + "\n")
    write(root, "sys/devices/system/cpu/cpuidle/current_driver", "intel_idle\n")
    if numa is not None:
        write(root, "proc/sys/kernel/numa_balancing", numa + "\n")
    if thp is not None:
        write(root, "sys/kernel/mm/transparent_hugepage/enabled", thp + "\n")
    if osrelease is not None:
        write(root, "proc/sys/kernel/osrelease", osrelease + "\n")
    for n, kind in enumerate(iommu_types):
        write(root, f"sys/kernel/iommu_groups/{n}/type", kind + "\n")
    if iommu_units is not None:
        (root / "sys/class/iommu").mkdir(parents=True, exist_ok=True)
        for unit in iommu_units:
            (root / "sys/class/iommu" / unit).mkdir()
    if cmdline is not None:
        write(root, "proc/cmdline", cmdline + "\n")
    bridges = (
        {"0000:00:01.0": acs_config(0x11), "0000:40:02.0": acs_config(0)}
        if (bridges is None)
        else bridges
    )
    for address, config in bridges.items():
        write(root, f"sys/bus/pci/devices/{address}/class", "0x060400\n")
        (root / f"sys/bus/pci/devices/{address}/config").write_bytes(config)
    write(root, "sys/bus/pci/devices/0000:17:00.0/class", "0x030200\n")  # a GPU: not judged
    for dev, ports in (GOOD_IB if ib is None else ib).items():
        for port, (state, rate, phys) in ports.items():
            base = f"sys/class/infiniband/{dev}/ports/{port}"
            write(root, f"{base}/state", state + "\n")
            write(root, f"{base}/rate", rate + "\n")
            write(root, f"{base}/phys_state", phys + "\n")
    return root


class NotSupported(Exception):
    pass


def fake_nvml(gpus=None):
    """A pynvml stand-in: ``gpus`` is a list of per-GPU settings (persistence, ecc,
    power_mw, default_mw, app, default_app, and the compute and graphics processes as
    ``(pid, bytes or None)``); a value ``"x"`` raises NotSupported."""
    gpus = gpus if gpus is not None else [{}, {}]
    base = {
        "persistence": 1,
        "ecc": (1, 1),
        "power_mw": 700_000,
        "default_mw": 700_000,
        "app": {1: 1755, 2: 2619},
        "default_app": {1: 1755, 2: 2619},
        "compute": [],
        "graphics": [],
    }
    settings = [dict(base, **g) for g in gpus]
    nv = types.ModuleType("pynvml")
    nv.NVML_FEATURE_ENABLED, nv.NVML_CLOCK_SM, nv.NVML_CLOCK_MEM = 1, 1, 2

    def getter(key, by_clock=False):
        def call(h, *args):
            value = settings[h][key]
            if by_clock:
                value = value if value == "x" else value[args[0]]
            if value == "x":
                raise NotSupported("Not Supported")
            return value

        return call

    nv.nvmlDeviceGetCount = lambda: len(settings)
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    nv.nvmlDeviceGetUUID = lambda h: f"GPU-{h}"
    nv.nvmlDeviceGetPersistenceMode = getter("persistence")
    nv.nvmlDeviceGetEccMode = getter("ecc")
    nv.nvmlDeviceGetPowerManagementLimit = getter("power_mw")
    nv.nvmlDeviceGetPowerManagementDefaultLimit = getter("default_mw")
    nv.nvmlDeviceGetApplicationsClock = getter("app", by_clock=True)
    nv.nvmlDeviceGetDefaultApplicationsClock = getter("default_app", by_clock=True)

    def processes(key):
        def call(h):
            value = getter(key)(h)
            return [types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in value]

        return call

    nv.nvmlDeviceGetComputeRunningProcesses = processes("compute")
    nv.nvmlDeviceGetGraphicsRunningProcesses = processes("graphics")
    return nv


@pytest.fixture(autouse=True)
def no_visibility(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def by_name(findings):
    return {f["name"]: f for f in findings}


# ------------------------------------------------------------------ the findings


def test_names_are_the_rules_schema_enum_and_every_finding_is_ok(tmp_path):
    findings = ps.prescreen(fake_tree(tmp_path), fake_nvml())
    assert [f["name"] for f in findings] == list(ps.NAMES)
    assert set(ps.NAMES) == {
        "cpu_cstates",
        "cpu_governor",
        "numa_balancing",
        "transparent_hugepages",
        "kernel",
        "gpu_persistence",
        "gpu_ecc",
        "gpu_power_limit",
        "gpu_app_clocks",
        "gpu_idle",
        "iommu",
        "pci_acs",
        "ib_port_state",
        "ib_port_rate",
        "ib_port_phys_state",
    }
    for f in findings:
        assert set(f) == {"name", "found", "expected", "ok", "why"}
        assert f["ok"] is True, f
    got = by_name(findings)
    assert got["transparent_hugepages"]["found"] == "madvise"
    assert got["kernel"] == {
        "name": "kernel",
        "found": "6.8.0-45-generic",
        "expected": None,
        "ok": True,
        "why": "recorded only: no expectation",
    }
    assert got["gpu_power_limit"]["found"] == (
        "GPU 0: 700 W (default 700 W); GPU 1: 700 W (default 700 W)"
    )
    assert got["gpu_idle"]["found"] == "GPU 0: none; GPU 1: none"
    assert got["iommu"]["found"].startswith("passthrough: group types identity (2)")
    assert got["ib_port_rate"]["found"] == "mlx5_0/1: 400 Gb/sec (4X NDR)"
    assert not ps.not_ok(findings)


def test_every_finding_not_ok(tmp_path):
    root = fake_tree(
        tmp_path,
        cstates=(("POLL", "0"), ("C1", "0"), ("C6", "0")),
        governors=("performance", "powersave"),
        numa="1",
        thp="[always] madvise never",
        iommu_types=("identity", "DMA-FQ"),
        cmdline="BOOT_IMAGE=/vmlinuz intel_iommu=on",
        ib={
            "mlx5_0": {"1": ("4: ACTIVE", "400 Gb/sec (4X NDR)", "5: LinkUp")},
            "mlx5_1": {"1": ("1: DOWN", "200 Gb/sec (4X HDR)", "3: Disabled")},
        },
        bridges={"0000:00:01.0": acs_config(0x3F)},
    )
    nvml = fake_nvml(
        [
            {},
            {
                "persistence": 0,
                "ecc": (1, 0),
                "power_mw": 500_000,
                "app": {1: 1400, 2: 2619},
                # one process in both lists (counted once), one whose memory NVML hides
                "compute": [(4242, 20 * 2**30), (77, None)],
                "graphics": [(4242, None)],
            },
        ]
    )
    got = by_name(ps.prescreen(root, nvml))
    bad = [n for n in ps.NAMES if got[n]["ok"] is not True]
    assert bad == [n for n in ps.NAMES if n != "kernel"]
    assert all(got[n]["ok"] is False for n in bad)
    assert got["cpu_cstates"]["found"] == "enabled: C6 on 2 of 2 CPUs"
    assert got["cpu_governor"]["found"] == "performance (1 CPUs), powersave (1 CPUs)"
    assert got["numa_balancing"]["found"] == "1"
    assert got["transparent_hugepages"]["found"] == "always"
    assert got["gpu_persistence"]["found"] == "GPU 0: on; GPU 1: off"
    assert got["gpu_ecc"]["found"] == (
        "GPU 0: current on, pending on; GPU 1: current on, pending off"
    )
    assert "GPU 1: 500 W (default 700 W)" in got["gpu_power_limit"]["found"]
    assert "GPU 1: SM 1400 MHz (default 1755)" in got["gpu_app_clocks"]["found"]
    assert got["gpu_idle"]["found"] == (
        "GPU 0: none; GPU 1: 2 process(es): pid 77, pid 4242 (20480 MiB)"
    )
    assert got["iommu"]["found"].startswith("translating")
    assert "mlx5_1/1: 1: DOWN" in got["ib_port_state"]["found"]
    assert "mlx5_1/1: 200 Gb/sec (4X HDR)" in got["ib_port_rate"]["found"]
    assert "mlx5_1/1: 3: Disabled" in got["ib_port_phys_state"]["found"]
    assert got["pci_acs"]["found"] == "1 of 1 bridge(s) redirect: 0000:00:01.0 (RR+CR+EC)"


def test_every_finding_unknown_on_an_empty_tree_without_nvml(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    findings = ps.prescreen(tmp_path)
    assert [f["ok"] for f in findings] == [None] * len(ps.NAMES)
    got = by_name(findings)
    for name in ps.GPU_NAMES:
        assert got[name]["why"].startswith("NVML not available (ModuleNotFoundError")
        assert got[name]["found"] is None
    assert "does not exist" in got["numa_balancing"]["why"]
    assert "cannot tell" in got["iommu"]["why"]
    assert "nothing to judge" in got["ib_port_state"]["why"]
    assert ps.not_ok(findings) == findings


def test_unsupported_nvml_calls_are_unknown_never_ok(tmp_path):
    unsupported = {"persistence": "x", "ecc": "x", "power_mw": "x", "app": "x"}
    nvml = fake_nvml([{**unsupported, "compute": "x", "graphics": "x"}, {}])
    got = by_name(ps.gpu_findings(nvml))
    for name in ps.GPU_NAMES:
        assert got[name]["ok"] is None, name
    assert got["gpu_persistence"]["found"] == "GPU 0: unknown; GPU 1: on"
    assert (
        "GPU 0: nvmlDeviceGetPersistenceMode: NotSupported: Not Supported"
        in (got["gpu_persistence"]["why"])
    )
    # one GPU not ok beside another unknown: not ok
    nvml = fake_nvml([{"persistence": "x"}, {"persistence": 0}])
    assert by_name(ps.gpu_findings(nvml))["gpu_persistence"]["ok"] is False
    # a pynvml without the call: unknown
    nvml = fake_nvml()
    del nvml.nvmlDeviceGetDefaultApplicationsClock
    got = by_name(ps.gpu_findings(nvml))
    assert got["gpu_app_clocks"]["ok"] is None
    assert (
        "this pynvml has no nvmlDeviceGetDefaultApplicationsClock" in got["gpu_app_clocks"]["why"]
    )
    # the process lists: a process in either is not ok; none found is ok only where the
    # compute list was read (the graphics one alone may be unsupported)
    nvml = fake_nvml([{"graphics": "x"}, {"compute": "x", "graphics": [(9, 2**20)]}])
    got = by_name(ps.gpu_findings(nvml))["gpu_idle"]
    assert got["ok"] is False and got["found"] == "GPU 0: none; GPU 1: 1 process(es): pid 9 (1 MiB)"
    nvml = fake_nvml([{"compute": "x"}, {}])
    got = by_name(ps.gpu_findings(nvml))["gpu_idle"]
    assert got["ok"] is None and got["found"] == "GPU 0: unknown; GPU 1: none"
    assert "GPU 0: nvmlDeviceGetComputeRunningProcesses: NotSupported" in got["why"]
    # the session's caller (this process or an ancestor) is named, not judged
    nvml = fake_nvml([{"compute": [(os.getpid(), 2**29)]}, {"graphics": [(os.getppid(), None)]}])
    got = by_name(ps.gpu_findings(nvml))["gpu_idle"]
    assert got["ok"] is True, got
    assert got["found"] == (
        f"GPU 0: none (besides this session's caller: pid {os.getpid()} (512 MiB)); "
        f"GPU 1: none (besides this session's caller: pid {os.getppid()})"
    )
    # NVML that sees no GPU: unknown
    got = by_name(ps.gpu_findings(fake_nvml([])))
    assert got["gpu_ecc"]["ok"] is None and "no GPU" in got["gpu_ecc"]["why"]


def test_nvml_that_fails_to_start_is_unknown(monkeypatch):
    broken = types.ModuleType("pynvml")

    def init():
        raise RuntimeError("Driver Not Loaded")

    broken.nvmlInit = init
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    for f in ps.gpu_findings():
        assert f["ok"] is None
        assert f["why"] == "NVML not available (RuntimeError: Driver Not Loaded)"


def test_unreadable_files_are_unknown_with_why(tmp_path):
    root = fake_tree(tmp_path, numa=None, thp=None, osrelease=None)
    # a folder where the file should be, and bytes that are not UTF-8: cannot be read
    (root / "proc/sys/kernel/numa_balancing").mkdir(parents=True)
    (root / "sys/kernel/mm/transparent_hugepage").mkdir(parents=True)
    (root / "sys/kernel/mm/transparent_hugepage/enabled").write_bytes(b"\xff\xfe")
    (root / "proc/sys/kernel/osrelease").mkdir()
    for cpu in (0, 1):
        disable = root / f"sys/devices/system/cpu/cpu{cpu}/cpuidle/state3/disable"
        disable.unlink()
        disable.mkdir()
    shutil.rmtree(root / "sys/devices/system/cpu/cpu1/cpufreq")
    port = root / "sys/class/infiniband/mlx5_0/ports/1"
    (port / "rate").unlink()
    got = by_name(ps.prescreen(root, fake_nvml()))
    for name in ("numa_balancing", "transparent_hugepages", "kernel"):
        assert got[name]["ok"] is None and "cannot be read" in got[name]["why"], name
    assert got["cpu_cstates"]["ok"] is None
    assert "cpu0/state3" in got["cpu_cstates"]["why"]
    assert got["cpu_governor"]["ok"] is None
    assert "1 CPU(s) without a readable governor" in got["cpu_governor"]["why"]
    assert got["ib_port_rate"]["ok"] is None
    assert got["ib_port_rate"]["found"] == "mlx5_0/1: unreadable"
    assert got["ib_port_state"]["ok"] is True


def test_cstates_governor_and_iommu_edge_cases(tmp_path):
    # no cpuidle driver at all: the CPUs halt, no deep state
    root = fake_tree(tmp_path / "a", cstates=())
    (root / "sys/devices/system/cpu/cpuidle/current_driver").write_text("none\n")
    assert ps.cpu_cstates(root)["ok"] is True
    # no cpuidle state and a driver: cannot tell
    root = fake_tree(tmp_path / "b", cstates=())
    assert ps.cpu_cstates(root)["ok"] is None
    # no cpufreq: unknown (most VMs)
    assert ps.cpu_governor(tmp_path / "nothing")["ok"] is None
    # IOMMU off: /sys/class/iommu empty, no groups
    root = fake_tree(tmp_path / "c", iommu_types=(), iommu_units=(), cmdline="ro quiet")
    assert ps.iommu(root)["ok"] is True and ps.iommu(root)["found"].startswith("off")
    # only the command line tells: iommu=off, amd_iommu=off, iommu=pt
    for word, mode in (("iommu=off", "off"), ("amd_iommu=off", "off"), ("iommu=pt", "passthrough")):
        root = fake_tree(tmp_path / word, iommu_types=(), iommu_units=None, cmdline=f"ro {word}")
        got = ps.iommu(root)
        assert got["ok"] is True and got["found"].startswith(f"{mode} (from the command line"), word
    # an unreadable THP value without brackets
    root = fake_tree(tmp_path / "d", thp="madvise")
    assert ps.transparent_hugepages(root)["ok"] is None


def test_prescreen_never_raises(tmp_path, monkeypatch):
    def boom(root):
        raise OSError("I/O error")

    monkeypatch.setattr(ps, "iommu", boom)
    got = by_name(ps.prescreen(fake_tree(tmp_path), fake_nvml()))
    assert got["iommu"]["ok"] is None and got["iommu"]["why"] == "OSError: I/O error"
    assert got["numa_balancing"]["ok"] is True


def test_the_identity_holds_the_prescreen_and_main_prints_json(tmp_path, capsys):
    root = fake_tree(tmp_path)
    nvml = fake_nvml()
    config = identity_mod.node_config(root, nvml)
    assert config["prescreen"] == ps.prescreen(root, nvml)
    ident = {"config": {"node": config}}
    assert ps.findings_of(ident) == config["prescreen"]
    assert ps.findings_of({"error": "no answer"}) is None
    assert ps.findings_of({"config": {"node": {"kernel": "x"}}}) is None  # identity before it
    assert ps.main() == 0
    out = json.loads(capsys.readouterr().out)
    assert out["format"] == "milarun-prescreen" and out["version"] == 1
    assert [f["name"] for f in out["findings"]] == list(ps.NAMES)


# ------------------------------------------------------------------ milarun jobs


def identity_with(findings):
    return {"format": "milarun-identity", "config": {"node": {"prescreen": findings}}}


def test_show_prescreen_prints_failed_and_unknown_and_returns_fatal(tmp_path):
    root = fake_tree(tmp_path, numa="1")
    findings = ps.prescreen(root, fake_nvml([{"persistence": "x"}]))
    lines = []
    found = {"n1": identity_with(findings), "n2": {"error": "no answer within 60 s"}}
    fatal = identities.show_prescreen(found, ["numa_balancing", "kernel"], log=lines.append)
    assert lines[0].startswith(
        "milarun: prescreen: n1: numa_balancing FAILED: found 1, expected 0 (automatic NUMA"
    )
    # the unknown ones in one line (a CPU host has no GPU nor InfiniBand finding to read)
    assert lines[1] == (
        "milarun: prescreen: n1: 1 unknown (gpu_persistence): milarun jobs --dry-run says why"
    )
    assert lines[2] == "milarun: prescreen: n2: not read (no answer within 60 s)"
    assert len(lines) == 3
    assert fatal[0].startswith("n1: numa_balancing FAILED")
    assert fatal[1:] == [
        "n2: numa_balancing not recorded (no prescreen from this node)",
        "n2: kernel not recorded (no prescreen from this node)",
    ]
    assert identities.show_prescreen(found, (), log=lines.append) == []


@pytest.fixture
def suite(tmp_path, monkeypatch):
    """A one-test profile on 2 CPU slots, cgexec and its cgroups faked, a data folder."""
    monkeypatch.delenv("MILARUN_DATAROOT", raising=False)
    monkeypatch.delenv("MILARUN_OUTROOT", raising=False)
    real = shutil.which
    monkeypatch.setattr(
        shutil, "which", lambda name: "/usr/bin/cgexec" if name == "cgexec" else real(name)
    )
    monkeypatch.setattr(isolation, "missing_groups", lambda specs: [])
    (tmp_path / "data").mkdir()
    profile = tmp_path / "p.json"
    profile.write_text(
        json.dumps(
            {
                "a": {
                    "experiment": "milarun.models.toy_reg:main",
                    "partition_scheme": {"type": "per-gpu"},
                }
            }
        )
    )
    return ["jobs", profile, "--cpu-slots", "2", "-d", tmp_path / "data", "-o", tmp_path / "out"]


def test_dry_run_prints_every_finding(suite, tmp_path, capsys, monkeypatch):
    findings = ps.prescreen(fake_tree(tmp_path / "node", numa="1"), fake_nvml())
    monkeypatch.setattr(dryrun, "prescreen", lambda: findings)
    host = socket.gethostname()
    code, out, err = run(suite + ["--dry-run"], capsys)
    assert (code, err) == (0, "")
    shown = [line for line in out.splitlines() if line.startswith("# prescreen: ")]
    assert len(shown) == len(ps.NAMES)
    assert shown[0].startswith(f"# prescreen: {host}: cpu_cstates ok: found no deep C-state")
    assert shown[2].startswith(f"# prescreen: {host}: numa_balancing FAILED: found 1, expected 0")
    assert out.splitlines()[-1].startswith("# checks passed")
    # made fatal: the dry run fails as the real run would
    code, out, err = run(
        suite + ["--dry-run", "--prescreen-fatal", "numa_balancing,kernel"], capsys
    )
    assert code == 2
    assert err.splitlines()[0].startswith(
        f"milarun: error: --prescreen-fatal: {host}: numa_balancing FAILED: found 1"
    )
    assert not (tmp_path / "out").exists()


def test_prescreen_fatal_stops_the_run_before_the_first_launch(
    suite, tmp_path, capsys, monkeypatch
):
    findings = ps.prescreen(fake_tree(tmp_path / "node", numa="1"), fake_nvml())
    monkeypatch.setattr(identities, "collect", lambda cluster: {"n1": identity_with(findings)})
    code, _, err = run(suite + ["--prescreen-fatal", "gpu_ecc,numa_balancing"], capsys)
    assert code == 2
    lines = err.splitlines()
    assert lines[0].startswith("milarun: prescreen: n1: numa_balancing FAILED: found 1")
    assert lines[-1].startswith(
        "milarun: error: --prescreen-fatal: 1 finding(s) not ok, nothing launched: "
        "n1: numa_balancing FAILED: found 1, expected 0"
    )
    assert not (tmp_path / "out/.milarun/session.json").exists()
    assert not list((tmp_path / "out").glob("*.json"))
    code, _, err = run(suite + ["--prescreen-fatal", "numa"], capsys)
    assert code == 2 and "--prescreen-fatal: unknown finding 'numa' (one of cpu_cstates" in err


# ------------------------------------------------------------------ verify


def bundle_with(identity_by_session):
    b = Bundle("/nowhere")
    b.entries = []
    b.session = {
        "invocation": {},
        "sessions": [{"id": sid, "identity": ident} for sid, ident in identity_by_session],
    }
    return b


def test_rules_prescreen_key(tmp_path):
    path = tmp_path / "rules.json"
    with open(path, "w") as f:
        json.dump({"prescreen": {"fatal": ["numa_balancing", "gpu_persistence"]}}, f)
    assert read_rules(path)["prescreen"]["fatal"] == ["numa_balancing", "gpu_persistence"]
    for bad, words in (
        ({"prescreen": {"fatal": ["numa"]}}, "prescreen.fatal.0: unknown prescreen finding"),
        ({"prescreen": {"fatal": []}}, "prescreen.fatal: must name at least one"),
        ({"prescreen": ["numa_balancing"]}, "prescreen: must be an object"),
    ):
        with open(path, "w") as f:
            json.dump(bad, f)
        with pytest.raises(RulesError, match=words):
            read_rules(path)


def test_verify_prescreen_clause_pass_fail_missing(tmp_path):
    good = ps.prescreen(fake_tree(tmp_path / "good"), fake_nvml())
    bad = ps.prescreen(fake_tree(tmp_path / "bad", numa="1"), fake_nvml([{"persistence": "x"}]))
    fatal = ["numa_balancing", "gpu_persistence"]

    v = Verdict(bundle="x")
    _prescreen_clause(bundle_with([("s1", {"n1": identity_with(good)})]), v, fatal)
    assert v.ok and [c.name for c in v.clauses] == ["compliance.prescreen"]
    assert "numa_balancing, gpu_persistence ok on every node" in v.clauses[0].detail

    v = Verdict(bundle="x")
    b = bundle_with(
        [("s1", {"n1": identity_with(good), "n2": identity_with(bad)}), ("s2", {"n1": {}})]
    )
    _prescreen_clause(b, v, fatal)
    details = [c.detail for c in v.failed]
    assert all(c.name == "compliance.prescreen" for c in v.failed)
    assert (
        details[0]
        == "node n1 (session s2): numa_balancing not recorded (no prescreen from this node)"
    )
    assert details[2].startswith("node n2 (session s1): numa_balancing FAILED: found 1")
    assert details[3].startswith("node n2 (session s1): gpu_persistence unknown")
    assert len(details) == 4

    # no identity at all: failed, said so
    v = Verdict(bundle="x")
    _prescreen_clause(bundle_with([]), v, fatal)
    (failed,) = v.failed
    assert "no node's hardware identity" in failed.detail

    # through the compliance section, as verify calls it
    v = Verdict(bundle="x")
    check_compliance(
        bundle_with([("s1", {"n1": identity_with(bad)})]), v, {"prescreen": {"fatal": ["kernel"]}}
    )
    assert v.ok and [c.name for c in v.clauses if "prescreen" in c.name] == ["compliance.prescreen"]
    v = Verdict(bundle="x")
    check_compliance(
        bundle_with([("s1", {"n1": identity_with(bad)})]), v, {"prescreen": {"fatal": fatal}}
    )
    assert [c.name for c in v.failed] == ["compliance.prescreen"] * 2


def test_pci_acs_names_the_bridges_that_redirect_peer_traffic(tmp_path):
    # SV+UF (0x11) is fine; RR (0x4), CR (0x8) and EC (0x20) redirect peer traffic
    bridges = {
        "0000:00:01.0": acs_config(0x11),
        "0000:00:02.0": acs_config(0x1D),
        "0000:00:03.0": acs_config(0x20, behind=False),
        "0000:00:04.0": acs_config(None),
    }
    got = ps.pci_acs(fake_tree(tmp_path, bridges=bridges))
    assert got["ok"] is False
    assert got["found"] == "2 of 4 bridge(s) redirect: 0000:00:02.0 (RR+CR), 0000:00:03.0 (EC)"
    ok = ps.pci_acs(fake_tree(tmp_path / "b"))
    assert ok["ok"] is True and ok["found"] == "none of 2 bridge(s) redirects"


def test_pci_acs_unreadable_or_absent_or_hostile_is_unknown(tmp_path):
    # not root: the kernel gives 64 bytes of a config file
    short = ps.pci_acs(fake_tree(tmp_path / "a", bridges={"0000:00:01.0": bytes(64)}))
    assert short["ok"] is None and "needs root" in short["why"]
    none = ps.pci_acs(fake_tree(tmp_path / "b", bridges={}))
    assert none["ok"] is None and "nothing to judge" in none["why"]
    # a capability list that loops on itself, or points below 0x100, ends
    loop = bytearray(4096)
    loop[0x100:0x104] = (0x0001 | 0x100 << 20).to_bytes(4, "little")
    assert ps.acs_control(bytes(loop)) is None
    low = bytearray(4096)
    low[0x100:0x104] = (0x0001 | 0x40 << 20).to_bytes(4, "little")
    assert ps.acs_control(bytes(low)) is None
    assert ps.acs_control(b"\xff" * 4096) is None and ps.acs_control(b"") is None
    # a redirecting bridge is a finding even when another cannot be read
    mixed = {"0000:00:01.0": bytes(64), "0000:00:02.0": acs_config(0x4)}
    assert ps.pci_acs(fake_tree(tmp_path / "c", bridges=mixed))["ok"] is False
