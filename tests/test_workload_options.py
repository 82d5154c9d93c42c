"""The options many workloads share (bench/options.py): declared once, one help text, each
workload's own default."""

import argparse
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest
from coleo import Option
from coleo.cli import catalogue

import milarun.models
from milarun.bench import options
from milarun.bench.experiment import _entry
from milarun.bench.literal_options import make_cli
from milarun.bench.options import (
    INFERENCE_PRECISIONS,
    PRECISIONS,
    backend_option,
    batch_size_option,
    common_options,
    lr_option,
    precision_option,
    workers_option,
)
from milarun.formats.child import COMMON_DEFAULTS

#: option name -> the helper of bench/options.py that declares it
SHARED = {
    "lr": lr_option,
    "batch_size": batch_size_option,
    "workers": workers_option,
    "precision": precision_option,
    "backend": backend_option,
}

#: Each workload's defaults, as they were when every workload declared its own options
#: (git show b56c5b9:milarun/models/*.py); they must not move.
DEFAULTS = {
    "cart": {"lr": 3e-3},
    "collectives": {"backend": "auto"},
    "convnet": {"batch_size": 256, "precision": "fp32", "lr": 0.1, "workers": -1},
    "diffusion": {
        "batch_size": 8,
        "precision": "bf16",
        "lr": 1e-4,
        "workers": -1,
        "backend": "auto",
    },
    "dcgan": {"batch_size": 64, "lr": 0.0002, "workers": -1, "precision": "fp32"},
    "ddp_convnet": {
        "batch_size": 128,
        "precision": "fp32",
        "lr": 0.1,
        "workers": -1,
        "backend": "auto",
    },
    "fast_style": {"batch_size": 4, "lr": 0.001, "workers": -1, "precision": "fp32"},
    "infer": {"batch_size": 64, "precision": "fp32", "workers": -1},
    "io": {"batch_size": 64, "workers": 0, "lr": 0.01},
    "llm_lora": {"batch_size": 2, "precision": "bf16", "lr": 2e-4, "workers": 1, "backend": "auto"},
    "llm_pretrain": {
        "batch_size": 4,
        "precision": "bf16",
        "lr": 3e-4,
        "workers": 1,
        "backend": "auto",
    },
    "llm_moe": {
        "batch_size": 2,
        "precision": "bf16",
        "lr": 3e-4,
        "workers": 1,
        "backend": "auto",
    },
    "llm_serve": {"batch_size": 32, "precision": "bf16", "backend": "auto"},
    "lightning_convnet": {
        "batch_size": 128,
        "precision": "fp32",
        "lr": 0.1,
        "workers": -1,
        "backend": "auto",
    },
    "loader": {"batch_size": 256, "workers": -1},
    "matmul": {},
    "ppo": {"lr": 2.5e-4, "precision": "fp32"},
    "recom": {"batch_size": 65536, "lr": 0.0045, "precision": "fp32"},
    "reso": {"batch_size": 64, "lr": 0.001, "workers": -1, "precision": "fp32"},
    "scaling": {"batch_size": 128, "lr": 0.05, "precision": "fp32", "backend": "auto"},
    "ssd": {"batch_size": 32, "lr": 0.002, "workers": -1, "precision": "fp32"},
    "toy_lstm": {"batch_size": 256, "lr": 1e-3},
    "toy_reg": {"batch_size": 64, "lr": 0.1},
    "txt2img": {"batch_size": 4, "precision": "fp16"},
    "translator": {"batch_size": 64, "lr": 5e-4, "workers": -1, "precision": "fp32"},
    "vae": {"batch_size": 128, "lr": 1e-3, "workers": -1},
    "vit": {"batch_size": 128, "precision": "bf16", "lr": 5e-4, "workers": -1, "backend": "auto"},
    "wlm": {"lr": 20.0, "batch_size": 20, "precision": "fp32"},
}

MODELS_DIR = Path(milarun.models.__file__).parent


class _Capture:
    """Stands in for an Experiment: keeps the tooled function ``main`` hands to ``cli``."""

    def cli(self, fn, argv):
        self.fn = fn


def _entries():
    """(label, tooled fn) of every workload entry point: each ``f(exp, argv)`` of models/."""
    found = []
    for info in pkgutil.iter_modules(milarun.models.__path__):
        module = importlib.import_module(f"milarun.models.{info.name}")
        for name, fn in vars(module).items():
            if (
                inspect.isfunction(fn)
                and fn.__module__ == module.__name__
                and not name.startswith("_")
                and list(inspect.signature(fn).parameters) == ["exp", "argv"]
            ):
                exp = _Capture()
                fn(exp, [])
                found.append((f"{info.name}:{name}", exp.fn))
    return found


ENTRIES = _entries()


def _help_texts(fn):
    """{dest: help} of the workload's parser, as ``-- --help`` prints it."""
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    make_cli(_entry, argv=[], extras=[common_options, fn], parser=parser)
    return {action.dest: action.help for action in parser._actions}


def _declarers(fn):
    """{option name: [functions declaring it]} over what coleo catalogues for ``fn``."""
    found = {}
    for owner, variables in catalogue([_entry, common_options, fn]).items():
        for name, data in variables.items():
            if data["annotation"] is not None and Option in getattr(
                data["annotation"], "members", [data["annotation"]]
            ):
                found.setdefault(name, []).append(owner)
    return found


def test_every_workload_entry_is_found():
    labels = {label for label, _ in ENTRIES}
    assert {f"{name}:main" for name in DEFAULTS} <= labels
    assert "faults:memhog" in labels


@pytest.mark.parametrize("label,fn", ENTRIES, ids=[label for label, _ in ENTRIES])
def test_shared_options_are_declared_once_in_bench(label, fn):
    declarers = _declarers(fn)
    helps = _help_texts(fn)
    for name, helper in SHARED.items():
        if name not in declarers:
            continue
        assert declarers[name] == [helper], (label, name, declarers[name])
        assert helps[name] == helper.__ptera_info__[name]["doc"], (label, name)


def test_each_shared_option_has_one_help_text_across_workloads():
    texts = {name: set() for name in SHARED}
    for _, fn in ENTRIES:
        helps = _help_texts(fn)
        for name in SHARED:
            if name in helps:
                texts[name].add(helps[name])
    assert all(len(found) == 1 for found in texts.values()), texts
    # every workload with a loader takes --workers, and from bench/options.py
    with_workers = {label.split(":")[0] for label, fn in ENTRIES if "workers" in _help_texts(fn)}
    assert with_workers == {m for m, d in DEFAULTS.items() if "workers" in d}


def test_no_workload_declares_a_shared_option_itself():
    declared = re.compile(r"^\s+(lr|batch_size|workers|precision|backend)\s*:\s*Option\b", re.M)
    offenders = [
        f"{path.name}: {m.group(0).strip()}"
        for path in sorted(MODELS_DIR.glob("*.py"))
        for m in declared.finditer(path.read_text())
    ]
    assert offenders == []


class _Stop(Exception):
    pass


@pytest.mark.parametrize("model", sorted(DEFAULTS))
def test_each_workload_keeps_its_defaults(model, monkeypatch):
    # Run the workload's option block outside a CLI (every option at its default), record
    # what each helper is given, and stop at the device set-up.
    module = importlib.import_module(f"milarun.models.{model}")
    got = {}

    def recorder(name):
        helper = SHARED[name]
        own = inspect.signature(helper).parameters["default"].default

        def record(default=own, **kwargs):
            got[name] = default
            return helper(default, **kwargs)

        return record

    for name in SHARED:
        if hasattr(module, f"{name}_option"):
            monkeypatch.setattr(module, f"{name}_option", recorder(name))

    def stop(exp):
        raise _Stop

    monkeypatch.setattr(module, "init_torch", stop)

    class Exp:
        dataroot = None

        def __init__(self):
            # the common options as a run parses them (milarun.formats.child)
            self.options = {**COMMON_DEFAULTS, "device": "cpu", "seed": 1}
            self.result, self.metrics = {"host": {}}, {}

        def cli(self, fn, argv):
            with pytest.raises(_Stop):
                fn(self)

    module.main(Exp(), [])
    assert got == DEFAULTS[model]
    assert all(type(got[k]) is type(v) for k, v in DEFAULTS[model].items())


def test_helpers_give_their_default_outside_a_cli():
    assert lr_option(0.1) == 0.1 and lr_option(default=20.0) == 20.0
    assert batch_size_option(default=64) == 64
    assert workers_option() == -1 and workers_option(default=0) == 0
    assert precision_option() == "fp32" and precision_option(default="bf16") == "bf16"
    assert backend_option() == "auto"


def test_the_command_line_replaces_the_default():
    from coleo import tooled

    @tooled
    def train(exp):
        return (
            lr_option(default=0.1),
            batch_size_option(default=64),
            workers_option(default=-1),
            precision_option(default="fp32"),
            backend_option(),
        )

    argv = ["--lr", "0.5", "--batch-size", "8", "--workers", "0", "--precision", "bf16"]
    opts, thunk = make_cli(train, argv=[*argv, "--backend", "gloo"])
    assert thunk(opts=opts, args=(None,)) == (0.5, 8, 0, "bf16", "gloo")
    opts, thunk = make_cli(train, argv=[])
    assert thunk(opts=opts, args=(None,)) == (0.1, 64, -1, "fp32", "auto")


def test_precision_is_checked_against_its_choices():
    with pytest.raises(
        ValueError,
        match=r"--precision must be one of fp32, tf32, fp16, bf16, "
        r"not 'fp8'",
    ):
        precision_option(default="fp8")
    with pytest.raises(
        ValueError,
        match=r"--precision must be one of fp32, fp16, bf16, "
        r"not 'tf32'",
    ):
        precision_option(default="tf32", choices=INFERENCE_PRECISIONS)


def test_precision_choices_match_what_the_workloads_map():
    from milarun.bench import setup
    from milarun.models import infer, lightning_convnet

    assert setup.PRECISIONS is options.PRECISIONS
    assert tuple(lightning_convnet.PRECISION) == PRECISIONS
    assert tuple(infer.DTYPES) == INFERENCE_PRECISIONS
