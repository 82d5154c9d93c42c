"""The configuration bound to a result: the identity's ``config`` (fake
NVML and sysfs), ``consistency.config`` of verify (hand-built records) and the
configuration differences of ``audit check`` (``compare_config``)."""

import copy
import json

import pytest
from test_monitor import fake_pynvml

from milarun.host import identity as identity_mod
from milarun.host.accel.nvidia import NvidiaBackend
from milarun.host.facts import GPU_CONFIG_KEYS
from milarun.verify import audit
from milarun.verify.check import Bundle, _config_clause, config_problems
from milarun.verify.verdict import Verdict


@pytest.fixture
def no_visibility(monkeypatch):
    for var in ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "MILARUN_BACKEND"):
        monkeypatch.delenv(var, raising=False)


def config_nvml(count=2):
    """test_monitor's fake pynvml with the configuration readings: GPU 1 capped at
    500 W, with ECC off; GPU 1's VBIOS and MIG mode raise NotSupported."""
    nv = fake_pynvml(count=count)
    nv.NVML_CLOCK_SM, nv.NVML_CLOCK_MEM, nv.NVML_FEATURE_ENABLED = 1, 2, 1
    nv.NVML_DEVICE_MIG_ENABLE = 1

    def unsupported_on_1(value):
        def call(h, *args):
            if h.index == 1:
                raise RuntimeError("Not Supported")
            return value

        return call

    nv.nvmlDeviceGetEnforcedPowerLimit = lambda h: 700_000 if h.index == 0 else 500_000
    nv.nvmlDeviceGetApplicationsClock = lambda h, kind: {1: 1755, 2: 2619}[kind]
    nv.nvmlDeviceGetPersistenceMode = lambda h: 1
    nv.nvmlDeviceGetEccMode = lambda h: (1, 1) if h.index == 0 else (0, 1)
    nv.nvmlDeviceGetMigMode = unsupported_on_1((0, 0))
    nv.nvmlDeviceGetVbiosVersion = unsupported_on_1(b"96.00.74.00.01")
    return nv


def fake_node(root, governors=("performance", "performance", "powersave"), imageid=None):
    for n, gov in enumerate(governors):
        path = root / f"sys/devices/system/cpu/cpu{n}/cpufreq/scaling_governor"
        path.parent.mkdir(parents=True)
        path.write_text(gov + "\n")
    if imageid is not None:
        (root / "run").mkdir()
        (root / "run/.containerenv").write_text(
            f'engine="podman-4.9.3"\nname="bench"\nid="abc"\n'
            f'image="registry.example/milarun:1"\nimageid="{imageid}"\nrootless=0\n'
        )
    return root


# ------------------------------------------------------------------ reading it


def test_nvidia_config_reads_each_value_on_its_own(no_visibility):
    backend = NvidiaBackend(pynvml=config_nvml())
    first, second = [backend.config(d) for d in backend.discover()]
    assert first == {
        "power_limit_w": 700.0,
        "sm_clock_app_mhz": 1755,
        "mem_clock_app_mhz": 2619,
        "ecc_mode": True,
        "mig_mode": False,
        "persistence_mode": True,
        "driver": "999.1",
        "vbios": "96.00.74.00.01",
    }
    assert second["power_limit_w"] == 500.0 and second["ecc_mode"] is False
    assert second["mig_mode"] is None and second["vbios"] is None  # unreadable: null


def test_nvidia_config_is_all_null_where_nvml_answers_nothing(no_visibility):
    nv = fake_pynvml(count=1)  # no power, clock, mode or VBIOS call at all
    backend = NvidiaBackend(pynvml=nv)
    device = backend.discover()[0]
    nv.nvmlSystemGetDriverVersion = lambda: 1 / 0
    assert backend.config(device) == dict.fromkeys(GPU_CONFIG_KEYS)
    broken = NvidiaBackend(pynvml=nv)
    broken._init = lambda: 1 / 0  # NVML that does not start: nothing read, no error
    assert broken.config(device) == dict.fromkeys(GPU_CONFIG_KEYS)


def test_identity_holds_the_node_and_gpu_config(tmp_path, monkeypatch, no_visibility):
    root = fake_node(tmp_path, imageid="C0FFEE" + "0" * 58)
    ident = identity_mod.identity(
        root, options={"nvidia": {"pynvml": config_nvml(), "root": str(root)}}
    )
    assert ident["version"] == identity_mod.IDENTITY_VERSION == 2
    config = ident["config"]
    assert config["node"]["cpu_governors"] == ["performance", "powersave"]
    assert config["node"]["container_image_id"] == "sha256:c0ffee" + "0" * 58
    assert config["node"]["kernel"]
    assert [(g["index"], g["uuid"], g["power_limit_w"]) for g in config["gpus"]] == [
        (0, "GPU-0aaa-0", 700.0),
        (1, "GPU-1aaa-1", 500.0),
    ]
    json.dumps(ident, allow_nan=False)


def test_unreadable_node_config_is_null(tmp_path, no_visibility):
    (tmp_path / "run").mkdir()
    (tmp_path / "run/.containerenv").write_text('engine="podman"\nimageid="not-a-digest"\n')
    assert identity_mod.node_config(tmp_path)["cpu_governors"] is None
    assert identity_mod.node_config(tmp_path)["container_image_id"] is None
    assert identity_mod.container_image_id(tmp_path / "nowhere") is None
    ident = identity_mod.identity(
        tmp_path,
        options={
            "nvidia": {"pynvml": fake_pynvml(0)},
            "amd": {"amdsmi": None},
            "intel": {"root": str(tmp_path)},
        },
    )
    assert ident["config"]["gpus"] == [] and ident["config"]["node"]["cpu_governors"] is None


# ------------------------------------------------------------------ verify

CONFIG = {
    "node": {"kernel": "6.8.0", "cpu_governors": ["performance"], "container_image_id": None},
    "gpus": [
        {
            "index": 0,
            "uuid": "GPU-a",
            "power_limit_w": 700.0,
            "sm_clock_app_mhz": 1755,
            "mem_clock_app_mhz": 2619,
            "ecc_mode": True,
            "mig_mode": False,
            "persistence_mode": True,
            "driver": "550.54",
            "vbios": "96.00",
        },
        {
            "index": 1,
            "uuid": "GPU-b",
            "power_limit_w": 700.0,
            "sm_clock_app_mhz": 1755,
            "mem_clock_app_mhz": 2619,
            "ecc_mode": True,
            "mig_mode": False,
            "persistence_mode": True,
            "driver": "550.54",
            "vbios": "96.00",
        },
    ],
}


def host(**gpu1):
    return {
        "hostname": "n1",
        "kernel": "6.8.0",
        "cpu_governor": "performance",
        "gpus": [
            {
                "index": 0,
                "uuid": "GPU-a",
                "power_limit_w": 700.0,
                "ecc_mode": True,
                "driver": "550.54",
            },
            {"index": 1, "uuid": "GPU-b", "power_limit_w": 700.0, "sm_clock_app_mhz": 1755, **gpu1},
        ],
    }


def test_config_problems_where_both_hold_the_value():
    assert config_problems(host(), CONFIG) == []
    assert config_problems(host(power_limit_w=None, ecc_mode=None), CONFIG) == []
    assert config_problems(
        {"kernel": "6.9.1", "cpu_governor": "mixed: performance, powersave", "gpus": []}, CONFIG
    ) == [
        "kernel '6.9.1', the identity's '6.8.0'",
        "CPU governor 'mixed: performance, powersave', the identity's performance",
    ]
    assert config_problems(host(power_limit_w=500.0, persistence_mode=False), CONFIG) == [
        "GPU 1 (GPU-b) power_limit_w 500.0, the identity's 700.0",
        "GPU 1 (GPU-b) persistence_mode False, the identity's True",
    ]
    # a GPU the identity does not list, a config without values: nothing to compare
    assert config_problems({"gpus": [{"uuid": "GPU-z", "power_limit_w": 1.0}]}, CONFIG) == []
    assert config_problems(host(power_limit_w=1.0), {"node": None, "gpus": None}) == []


def bundle_of(records, identity):
    b = Bundle("/nowhere")
    sid = "20260101-000000-000000"
    b.entries = [{"session": sid, "kind": "record", "path": p} for p in records]
    b.last = {p: {"session": sid, "path": p} for p in records}
    b.records = records
    b.session = {"sessions": [{"id": sid, "identity": identity}]}
    return b


def test_consistency_config_clause():
    ident = {"n1": {"hostname": "n1", "config": CONFIG}}
    good = {"a.PASS.json": {"node": "n1", "host": host()}}
    v = Verdict(bundle="x")
    _config_clause(bundle_of(good, ident), v)
    assert v.ok and [c.name for c in v.clauses] == ["consistency.config"]
    assert "1 record(s)" in v.clauses[0].detail

    bad = dict(good, **{"b.PASS.json": {"node": "n1", "host": host(power_limit_w=450.0)}})
    v = Verdict(bundle="x")
    _config_clause(bundle_of(bad, ident), v)
    (failed,) = v.failed
    assert failed.name == "consistency.config" and failed.paths == ["b.PASS.json"]
    assert "GPU 1 (GPU-b) power_limit_w 450.0, the identity's 700.0" in failed.detail

    # an identity of version 1 (no config): nothing to compare, said so
    v = Verdict(bundle="x")
    _config_clause(bundle_of(bad, {"n1": {"hostname": "n1"}}), v)
    assert v.ok and "nothing to compare" in v.clauses[0].detail


# ------------------------------------------------------------------ audit


def identity_with(config):
    return {"hostname": "n1", "gpus": [{"uuid": "GPU-a"}, {"uuid": "GPU-b"}], "config": config}


def test_compare_config_lists_each_difference():
    bid = identity_with(CONFIG)
    assert audit.compare_config(bid, copy.deepcopy(bid)) == []
    delivered = copy.deepcopy(bid)
    delivered["config"]["gpus"][1].update(power_limit_w=500.0, ecc_mode=False, vbios=None)
    delivered["config"]["node"].update(
        kernel="6.9.1", cpu_governors=["powersave"], container_image_id="sha256:" + "1" * 64
    )
    assert audit.compare_config(bid, delivered) == [
        "kernel 6.8.0 in the bid, 6.9.1 delivered",
        "CPU governors performance in the bid, powersave delivered",
        "container image not read in the bid, sha256:" + "1" * 64 + " delivered",
        "GPU 1 power limit 700 W in the bid, 500 W delivered",
        "GPU 1 ECC on in the bid, off delivered",
        "GPU 1 VBIOS 96.00 in the bid, not read delivered",
    ]
    # a raised power limit is a difference too; a GPU on one side only
    up = copy.deepcopy(bid)
    up["config"]["gpus"][0]["power_limit_w"] = 750.0
    up["config"]["gpus"].append(dict(CONFIG["gpus"][0], index=2, uuid="GPU-c"))
    assert audit.compare_config(bid, up) == [
        "GPU 0 power limit 700 W in the bid, 750 W delivered",
        "GPU 2 (GPU-c) configured only in the delivered machine",
    ]


def test_compare_config_without_a_config():
    assert audit.compare_config({"hostname": "n1"}, identity_with(CONFIG)) == [
        "configuration not recorded in the bundle (its identity has no config)"
    ]
    assert audit.compare_config(identity_with(CONFIG), {"hostname": "n1"}) == [
        "configuration not recorded in the rerun (its identity has no config)"
    ]
