"""GPU health counters (milarun.host.health) around a launch, through a fake NVML: the
counters read, unknown ones, each severity of a finding, a counter going backwards, the
launcher's ``health`` field in a real short launch's record, and its flags in the summary
and the report. None of this has run on a real GPU."""

import json
import sys
import types

import pytest

from milarun.analysis.summary import summarize
from milarun.formats.record import FORMAT_VERSION, new_result, validate
from milarun.formats.store import load_result, write_result
from milarun.host import health
from milarun.launcher.waves import run_wave
from milarun.measure.flags import ERROR, HEALTH_RULES, WARNING, from_summary, health_flags
from milarun.plan.launches import Launch
from milarun.profile.job import Job
from milarun.report import checks

STAMP = "20261128-000000-000000"


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801 (pynvml's name)
    pass


class NVMLError_InvalidArgument(NVMLError):  # noqa: N801
    pass


class NVMLError_Timeout(NVMLError):  # noqa: N801
    pass


class FakeGPU:
    """One GPU's counters; ``None`` for one it does not support (raises NotSupported)."""

    def __init__(self, index, links=2):
        self.index = index
        self.uuid = f"GPU-fake-{index}"
        self.ecc = {(1, 0): 0, (1, 1): 3, (0, 0): 0, (0, 1): 10}  # (error type, counter type)
        self.retired = {0: 0, 1: 0}
        self.retired_pending = 0
        self.rows = [0, 0, 0, 0]
        self.replays = 0
        self.gen, self.gen_max, self.width, self.width_max = 1, 5, 16, 16
        self.violation = {0: 0, 1: 0, 3: 0, 5: 0}
        self.links = links
        self.nvlink = {(link, c): 0 for link in range(links) for c in range(5)}
        self.xids = []
        self.unsupported = set()  # names of calls that raise NotSupported


class FakeNVML(types.SimpleNamespace):
    """The pynvml calls milarun.host.health makes, over :class:`FakeGPU` values."""

    NVML_NVLINK_MAX_LINKS = 4
    NVML_FEATURE_ENABLED = 1
    nvmlEventTypeXidCriticalError = 8

    def __init__(self, gpus):
        super().__init__()
        self.gpus = gpus
        self.sets = {}

    def _gpu(self, name, handle):
        if name in handle.unsupported:
            raise NVMLError_NotSupported("Not Supported")
        return handle

    def nvmlDeviceGetHandleByIndex(self, i):
        return self.gpus[i]

    def nvmlDeviceGetHandleByUUID(self, uuid):
        for g in self.gpus:
            if g.uuid == uuid:
                return g
        raise NVMLError("Not Found")

    def nvmlDeviceGetIndex(self, h):
        return h.index

    def nvmlDeviceGetUUID(self, h):
        return h.uuid

    def nvmlDeviceGetTotalEccErrors(self, h, etype, ctype):
        return self._gpu("ecc", h).ecc[(etype, ctype)]

    def nvmlDeviceGetRetiredPages(self, h, cause):
        return [0x1000 * i for i in range(self._gpu("retired", h).retired[cause])]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h):
        return self._gpu("retired", h).retired_pending

    def nvmlDeviceGetRemappedRows(self, h):
        return tuple(self._gpu("rows", h).rows)

    def nvmlDeviceGetPcieReplayCounter(self, h):
        return self._gpu("pcie", h).replays

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return self._gpu("pcie", h).gen

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return self._gpu("pcie", h).gen_max

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return self._gpu("pcie", h).width

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return self._gpu("pcie", h).width_max

    def nvmlDeviceGetViolationStatus(self, h, policy):
        return types.SimpleNamespace(
            referenceTime=0, violationTime=self._gpu("violation", h).violation[policy]
        )

    def nvmlDeviceGetNvLinkState(self, h, link):
        if link >= self._gpu("nvlink", h).links:
            raise NVMLError_InvalidArgument("Invalid Argument")
        return 1

    def nvmlDeviceGetNvLinkErrorCounter(self, h, link, counter):
        return self._gpu("nvlink", h).nvlink[(link, counter)]

    def nvmlEventSetCreate(self):
        event_set = object()
        self.sets[event_set] = []
        return event_set

    def nvmlDeviceRegisterEvents(self, h, kind, event_set):
        self._gpu("events", h)
        assert kind == 8
        self.sets[event_set] = h
        h.xids = []  # events from now on

    def nvmlEventSetWait_v2(self, event_set, timeout_ms):
        h = self.sets[event_set]
        if not h.xids:
            raise NVMLError_Timeout("Timeout")
        return types.SimpleNamespace(device=h, eventType=8, eventData=h.xids.pop(0))

    def nvmlEventSetFree(self, event_set):
        self.sets.pop(event_set, None)


def read(nv, targets=("GPU-fake-0",)):
    return health.snapshot(list(targets), nv)


# ------------------------------------------------------------------ snapshots


def test_a_snapshot_reads_every_counter_as_a_json_value():
    nv = FakeNVML([FakeGPU(0)])
    snap = read(nv)
    json.dumps(snap)  # plain JSON
    assert snap["available"] is True and snap["reason"] is None
    (gpu,) = snap["gpus"]
    assert (gpu["index"], gpu["uuid"], gpu["target"]) == (0, "GPU-fake-0", "GPU-fake-0")
    c = gpu["counters"]
    assert c["ecc_uncorrected_aggregate"] == 3 and c["ecc_corrected_aggregate"] == 10
    assert c["retired_pages_sbe"] == 0 and c["remap_failure"] == 0
    assert (c["pcie_gen"], c["pcie_gen_max"], c["pcie_width"], c["pcie_width_max"]) == (
        1,
        5,
        16,
        16,
    )
    assert c["throttle_thermal_ns"] == 0
    assert c["nvlink0_replay"] == 0 and c["nvlink1_ecc_data"] == 0 and "nvlink2_replay" not in c
    assert gpu["unknown"] == {}
    # an index names the same GPU
    assert read(nv, ["0"])["gpus"][0]["counters"] == c


def test_unsupported_counters_are_unknown_with_the_reason_never_healthy():
    gpu = FakeGPU(0)
    gpu.unsupported = {"ecc", "rows", "nvlink"}
    snap = read(FakeNVML([gpu]))
    (g,) = snap["gpus"]
    assert g["counters"]["ecc_uncorrected_volatile"] is None
    assert g["counters"]["remap_failure"] is None
    assert "NotSupported" in g["unknown"]["ecc_uncorrected_volatile"]
    assert "NotSupported" in g["unknown"]["remapped_rows_corrected"]
    assert "NotSupported" in g["unknown"]["nvlink"]
    assert not any(k.startswith("nvlink0") for k in g["counters"])

    # a pynvml without a call: unknown too
    class Older(FakeNVML):
        nvmlDeviceGetPcieReplayCounter = None

    g = read(Older([FakeGPU(0)]))["gpus"][0]
    assert g["counters"]["pcie_replays"] is None
    assert g["unknown"]["pcie_replays"] == "this pynvml has no nvmlDeviceGetPcieReplayCounter"
    # a GPU that cannot be found, and no NVML at all
    snap = read(FakeNVML([FakeGPU(0)]), ["GPU-gone"])
    assert snap["gpus"][0]["counters"] == {} and "Not Found" in snap["gpus"][0]["unknown"]["gpu"]


def test_no_nvml_is_not_available_with_the_reason(monkeypatch):
    def broken():
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(health, "nvml", broken)
    snap = health.snapshot(["GPU-fake-0"])
    assert snap["available"] is False and "pynvml" in snap["reason"]


# ------------------------------------------------------------------ the diff


def test_each_severity_of_a_finding():
    gpu = FakeGPU(0)
    nv = FakeNVML([gpu])
    before = read(nv)
    gpu.ecc[(1, 0)] += 2  # uncorrected, volatile: error
    gpu.ecc[(0, 0)] += 5  # corrected: warning
    gpu.retired[1] += 1  # a page retired for a double-bit error: error
    gpu.rows[3] = 1  # a remapping failure: error
    gpu.replays += 40  # PCIe replays: warning
    gpu.nvlink[(1, 2)] += 7  # NVLink CRC flit errors: warning
    gpu.violation[1] += 10**9  # thermal throttling: warning
    gpu.violation[0] += 10**9  # power throttling: recorded, not a finding
    gpu.gen = 4  # the generation an idle link drops to: recorded, not a finding
    after = read(nv)
    found = {(f["counter"], f["severity"]) for f in health.diff(before, after)}
    assert found == {
        ("ecc_uncorrected_volatile", "error"),
        ("ecc_corrected_volatile", "warning"),
        ("retired_pages_dbe", "error"),
        ("remap_failure", "error"),
        ("pcie_replays", "warning"),
        ("nvlink1_crc_flit", "warning"),
        ("throttle_thermal_ns", "warning"),
    }
    ecc = next(f for f in health.diff(before, after) if f["counter"] == "ecc_uncorrected_volatile")
    assert ecc == {
        "gpu": 0,
        "uuid": "GPU-fake-0",
        "counter": "ecc_uncorrected_volatile",
        "severity": "error",
        "before": 0,
        "after": 2,
        "message": "uncorrected ECC errors (volatile) went up by 2 during the launch (0 -> 2)",
    }
    # nothing changed: nothing found
    assert health.diff(after, read(nv)) == []


def test_a_narrow_pcie_link_is_a_warning():
    gpu = FakeGPU(0)
    gpu.width = 8
    nv = FakeNVML([gpu])
    (f,) = health.diff(read(nv), read(nv))
    assert (f["counter"], f["severity"], f["after"]) == ("pcie_width", "warning", 8)
    assert "x8 after the launch, below its maximum x16" in f["message"]


def test_a_counter_going_backwards_is_a_finding_never_a_crash():
    gpu = FakeGPU(0)
    nv = FakeNVML([gpu])
    before = read(nv)
    gpu.ecc[(0, 1)] = 2  # aggregate corrected went from 10 to 2: a reset, another GPU
    (f,) = health.diff(before, read(nv))
    assert f["counter"] == "ecc_corrected_aggregate" and f["severity"] == "warning"
    assert health.BACKWARDS in f["message"] and (f["before"], f["after"]) == (10, 2)
    # unknown on one side, malformed snapshots, another GPU: no finding, no exception
    gpu.unsupported = {"ecc"}
    assert health.diff(before, read(nv)) == []
    assert health.diff(None, {"gpus": [1, {"counters": None}]}) == []
    assert health.diff(before, {"gpus": [{"index": 5, "uuid": "x", "counters": {"xid": 3}}]}) == []


# ------------------------------------------------------------------ XID events and the field


def test_xid_events_during_a_launch_are_errors():
    gpu = FakeGPU(0)
    nv = FakeNVML([gpu])
    watch = health.LaunchHealth(["GPU-fake-0"])
    health.NVML, saved = nv, health.NVML
    try:
        watch.begin()
        gpu.xids = [79, 48]
        field = watch.end()
    finally:
        health.NVML = saved
    assert watch.end() is field  # read once
    (g,) = field["gpus"]
    assert g["counters"]["xid"] == 2 and g["xid_codes"] == [79, 48] and g["deltas"] == {"xid": 2}
    (f,) = field["findings"]
    assert (f["counter"], f["severity"]) == ("xid", "error")
    rec = new_result("s.t")
    rec["health"] = field
    validate(json.loads(json.dumps(rec)))  # the record's schema takes it


def test_events_that_cannot_be_registered_leave_xid_unknown():
    gpu = FakeGPU(0)
    gpu.unsupported = {"events"}
    watch = health.LaunchHealth(["GPU-fake-0"])
    health.NVML, saved = FakeNVML([gpu]), health.NVML
    try:
        watch.begin()
        field = watch.end()
    finally:
        health.NVML = saved
    (g,) = field["gpus"]
    assert g["counters"]["xid"] is None and "NotSupported" in g["unknown"]["xid"]
    assert field["findings"] == []


def test_mig_instances_read_their_gpu_once():
    gpu = FakeGPU(0)

    class WithMig(FakeNVML):
        def nvmlDeviceGetHandleByUUID(self, uuid):
            if uuid.startswith("MIG-"):
                return ("mig", uuid)
            return super().nvmlDeviceGetHandleByUUID(uuid)

        def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, mig):
            assert mig[0] == "mig"
            return gpu

    nv = WithMig([gpu])
    watch = health.LaunchHealth(["MIG-a", "MIG-b"])
    health.NVML, saved = nv, health.NVML
    try:
        watch.begin()
        assert len(nv.sets) == 1  # one event set for the GPU
        gpu.ecc[(0, 0)] += 1
        field = watch.end()
    finally:
        health.NVML = saved
    assert [(g["index"], g["uuid"]) for g in field["gpus"]] == [(0, "GPU-fake-0")]
    assert [f["counter"] for f in field["findings"]] == ["ecc_corrected_volatile"]


def test_which_launches_are_read():
    def lch(env, cluster=None):
        return types.SimpleNamespace(env=env, cluster=cluster)

    assert health.LaunchHealth.for_launch(lch({"MILARUN_BACKEND": "cpu"})) is None
    assert health.LaunchHealth.for_launch(lch({})) is None
    amd = health.LaunchHealth.for_launch(lch({"MILARUN_BACKEND": "amd"}))
    assert amd.end() == {"available": False, "reason": amd.reason} and "amd" in amd.reason
    remote = health.LaunchHealth.for_launch(
        lch(
            {"MILARUN_BACKEND": "nvidia", "CUDA_VISIBLE_DEVICES": "GPU-a"},
            types.SimpleNamespace(kind="ssh"),
        )
    )
    assert remote.end()["available"] is False and "own node" in remote.reason
    mine = health.LaunchHealth.for_launch(
        lch({"MILARUN_BACKEND": "nvidia", "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"})
    )
    assert mine.targets == ["GPU-a", "GPU-b"] and mine.reason is None


# ------------------------------------------------------------------ a real launch


def crawl_launch(tmp_path, gpus="GPU-fake-0", extra=()):
    job = Job("t", "crawl", "milarun.models.faults:crawl", plan_type="per-gpu")
    result = tmp_path / f"t.crawl.J0.0.{STAMP}.json"
    argv = [
        sys.executable,
        "-m",
        "milarun",
        "run",
        "milarun.models.faults:crawl",
        "-o",
        str(result),
        "--experiment-name",
        "t.crawl",
        "--job-id",
        "0.0",
        "--",
        "--max-count",
        "5",
        "--sample-duration",
        "0.05",
        "--step-seconds",
        "0.01",
        "--warmup",
        "0",
        *extra,
    ]
    return Launch(
        name="t.crawl",
        job=job,
        run=0,
        device="0",
        devices=[0],
        argv=argv,
        env={"MILARUN_BACKEND": "nvidia", "CUDA_VISIBLE_DEVICES": gpus},
        group="t.crawl",
        log="t.crawl.J0.0.log",
        timeout=120.0,
        result_path=result,
        fail_path=tmp_path / f"t.crawl.J0.0.FAIL.{STAMP}.json",
    )


class CountingFake(FakeNVML):
    """A fake whose GPU 0 gets an uncorrected ECC error and PCIe replays while the child
    runs: the first snapshot sees none, the second sees them."""

    def __init__(self):
        super().__init__([FakeGPU(0), FakeGPU(1)])
        self.reads = 0

    def nvmlDeviceGetTotalEccErrors(self, h, etype, ctype):
        if (etype, ctype) == (1, 0):
            self.reads += 1
            if self.reads > 1:  # after the launch
                h.ecc[(1, 0)] = 1
                h.replays = 12
        return super().nvmlDeviceGetTotalEccErrors(h, etype, ctype)


@pytest.mark.parametrize("passes", [True, False])
def test_the_launcher_stores_health_in_the_record_of_a_real_launch(tmp_path, monkeypatch, passes):
    fake = CountingFake()
    monkeypatch.setattr(health, "NVML", fake)
    extra = () if passes else ("--exit-code", "3")  # a FAIL record, written by the launcher
    (out,) = run_wave([crawl_launch(tmp_path, extra=extra)], tmp_path)
    assert out.success is passes
    rec = load_result(out.result_path)  # the schema takes it
    assert rec["version"] == FORMAT_VERSION == 13
    h = rec["health"]
    assert h["available"] is True and h["source"] == "nvml" and h["start"] <= h["end"]
    assert [g["index"] for g in h["gpus"]] == [0]  # only the launch's GPU
    assert h["gpus"][0]["deltas"] == {"ecc_uncorrected_volatile": 1, "pcie_replays": 12}
    assert {(f["counter"], f["severity"]) for f in h["findings"]} == {
        ("ecc_uncorrected_volatile", "error"),
        ("pcie_replays", "warning"),
    }
    assert fake.reads == 2  # once before, once after
    assert fake.sets == {}  # the XID event set was freed
    assert rec["timings"]["train"]["samples"]  # the measurement is kept


def test_cpu_launches_record_no_health(tmp_path, monkeypatch):
    monkeypatch.setattr(health, "NVML", None)
    lch = crawl_launch(tmp_path)
    lch.env = {"MILARUN_BACKEND": "cpu", "CUDA_VISIBLE_DEVICES": ""}
    (out,) = run_wave([lch], tmp_path)
    assert out.success and "health" not in load_result(out.result_path)
    assert health.NVML is None  # NVML was never loaded


# ------------------------------------------------------------------ flags, summary, report


def test_the_health_rules_and_flags():
    assert HEALTH_RULES["gpu-health-error"].severity == ERROR
    assert HEALTH_RULES["gpu-health-warning"].severity == WARNING
    rec = {
        "health": {
            "gpus": [{"index": 3, "counters": {"pcie_width": 8, "pcie_width_max": 16}}],
            "findings": [
                {"gpu": 3, "counter": "xid", "severity": "error", "before": 0, "after": 1,
                 "message": "XID critical errors went up by 1 (0 -> 1)"},
                {"gpu": 3, "counter": "pcie_width", "severity": "warning", "before": 8,
                 "after": 8, "message": "PCIe link trained at x8, below its maximum x16"},
                {"gpu": 3, "counter": "ecc_corrected_aggregate", "severity": "warning",
                 "before": 10, "after": 2, "message": "counter went backwards"},
            ],
        }
    }  # fmt: skip
    xid, pcie, back = health_flags(rec)
    assert xid.id == "gpu-health-error" and xid.severity == ERROR and xid.gpu == 3
    assert xid.figures == {"value": 1} and xid.message.startswith("GPU 3: XID")
    assert "the GPU fails" in xid.message
    assert pcie.severity == WARNING and pcie.figures == {"value": 8, "threshold": 16}
    assert back.figures == {}
    assert health_flags({}) == [] and health_flags({"health": {"available": False}}) == []


def _record(device, findings, success=True):
    rec = new_result("s.crawl", f"0.{device}", device=str(device), devices=[device])
    rec["partition"] = "per-gpu"
    rec["success"] = success
    rec["timings"]["program"] = {"start": 1.0e9, "end": 1.0e9 + 30, "duration": 30.0}
    rec["timings"]["train"]["samples"] = [
        {"start": float(t), "end": float(t + 1), "count": 10, "rate": 10.0, "warmup": t < 2}
        for t in range(25)
    ]
    if not success:
        rec["error"] = {"reason": "error", "message": "x", "type": "E", "traceback": None,
                        "returncode": 1, "signal": None, "stderr_tail": ""}  # fmt: skip
    rec["health"] = {"available": True, "reason": None, "source": "nvml", "gpus": [],
                     "findings": findings}  # fmt: skip
    return rec


def test_health_flags_in_the_summary_and_the_report(tmp_path):
    error = {"gpu": 0, "counter": "remap_failure", "severity": "error", "before": 0,
             "after": 1, "message": "a row remapping failure went up by 1 (0 -> 1)"}  # fmt: skip
    warning = {"gpu": 1, "counter": "nvlink0_replay", "severity": "warning", "before": 0,
               "after": 4, "message": "NVLink 0 replays went up by 4 (0 -> 4)"}  # fmt: skip
    paths = {}
    for device, findings, ok in ((0, [error], True), (1, [warning], False)):
        rec = _record(device, findings, ok)
        paths[write_result(rec, tmp_path / f"s.crawl.J0.{device}.{STAMP}.json")] = rec
    summary = summarize([(p, load_result(p)) for p in paths])
    flags = summary["tests"]["s.crawl"]["validation_flags"]
    assert [(f["check"], f["device"], f["gpu"], f.get("value")) for f in flags] == [
        ("gpu-health-error", "0", 0, 1),
        ("gpu-health-warning", "1", 1, 4),  # a failed launch's too
    ]
    assert flags[0]["file"] == f"s.crawl.J0.0.{STAMP}.json" and flags[0]["run"] == 0
    f = from_summary(flags[0])
    assert f.severity == ERROR and "the GPU fails" in f.message
    line = checks.flag_line("s.crawl", f)
    assert line.startswith("s.crawl run 0 device 0: gpu-health-error: GPU 0: a row remapping")
    assert "gpu-health-error" in str(checks.flag_html("s.crawl", f))


@pytest.mark.parametrize("passes", [True, False])
def test_a_health_field_the_schema_refuses_never_costs_the_record(tmp_path, monkeypatch, passes):
    gpu = FakeGPU(0)
    gpu.replays = 2**70  # past the schema's 64-bit bound
    monkeypatch.setattr(health, "NVML", FakeNVML([gpu]))
    extra = () if passes else ("--exit-code", "3")
    (out,) = run_wave([crawl_launch(tmp_path, extra=extra)], tmp_path)
    assert out.success is passes and out.write_error is None
    rec = load_result(out.result_path)
    assert "health" not in rec and rec["timings"]["train"]["samples"]  # samples kept
    if not passes:
        assert "the health field was unusable" in rec["error"]["message"]


def test_the_rules_judge_health_errors_and_unread_gpus(tmp_path):
    """``max_gpu_health_errors``: ``performance.gpu-health`` counts the errors recomputed
    from the records; ``performance.gpu-health-read`` fails a record without readings."""
    from milarun.formats.rules import read_rules
    from milarun.verify.check import Bundle, check_performance
    from milarun.verify.verdict import Verdict

    error = {"gpu": 0, "counter": "xid", "severity": "error", "before": 0, "after": 1,
             "message": "XID 79 (fell off the bus)"}  # fmt: skip
    rules = tmp_path / "rules.json"

    def judge(records, limit):
        rules.write_text(json.dumps({"max_gpu_health_errors": limit}))
        b = Bundle(tmp_path)
        b.entries = []
        b.records = {f"r{i}.json": rec for i, rec in enumerate(records)}
        b.summary = summarize(list(b.records.items()))
        v = Verdict(bundle=str(tmp_path))
        check_performance(b, v, read_rules(rules))
        return {c.name: c for c in v.clauses if c.name.startswith("performance.gpu-health")}

    clean = judge([_record(0, []), _record(1, [])], 0)
    assert clean["performance.gpu-health"].ok and clean["performance.gpu-health-read"].ok
    bad = judge([_record(0, [error]), _record(1, [])], 0)["performance.gpu-health"]
    assert not bad.ok and "1 GPU health error(s)" in bad.detail and "XID 79" in bad.detail
    assert judge([_record(0, [error]), _record(1, [])], 1)["performance.gpu-health"].ok
    unread = _record(1, [])
    unread["health"] = {"available": False, "reason": "AMD GPUs are not read"}
    read = judge([_record(0, []), unread], 0)["performance.gpu-health-read"]
    assert not read.ok and read.paths == ["r1.json"]
