"""Job × devices × run → launches. Pure: nothing is started here.

Schemes:

* ``per-gpu``: one launch per device, all concurrent, each with
  ``CUDA_VISIBLE_DEVICES=i`` (empty on CPU slots), job id ``{run}.{i}`` and
  the student cgroup from the template.
* ``gpu-progression``: launches on devices ``0..k-1`` for k = 1..N, one after
  the other; grouped as ``name.k``. They use the whole machine (no cgroup).
* ``normal``: one launch on every device (label ``all``), no cgroup.

A plan is a list of *waves*: launches in a wave run concurrently, waves run
in sequence.

The plan owns every path: each launch gets its result path (and the FAIL
path the launcher uses if the run fails) and its journal path before
anything starts, all stamped with the session id (the UTC start time of
``milarun jobs``), so two sessions never name the same record and nothing
is found by globbing. Its log, ``logs/<suite>.<job>.J<run>.<device>.log``,
is not stamped: a resumed session appends to it.
"""

import datetime
import json
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .isolation import wrap
from .results.store import journal_path, result_filename


@dataclass
class Launch:
    """One child process to start.

    Attributes:
        name: ``suite.job``.
        job: the ``Job``.
        run: repeat index.
        device: device label used in file names (``"0"``, ``"0-3"``, ``"all"``).
        devices: device indices given to the child.
        argv: full command (with cgexec/exec prefix).
        env: variables set on top of the parent's environment.
        cgroup: ``"controllers:group"`` or None.
        concurrent: True when started alongside the rest of its wave.
        group: summary group (``suite.job`` or ``suite.job.k``).
        log: log file name relative to ``OUTDIR/logs``.
        test_argv: the test's own arguments (recorded for reruns).
        timeout: seconds.
        result_path: where the child writes its record (``Path``).
        fail_path: where a failed run's record goes (``FAIL`` in the name).
    """

    name: str
    job: object
    run: int
    device: str
    devices: list
    argv: list
    env: dict
    cgroup: str = None
    concurrent: bool = False
    group: str = ""
    log: str = ""
    test_argv: list = field(default_factory=list)
    timeout: float = 1800.0
    result_path: Path = None
    fail_path: Path = None

    @property
    def job_id(self):
        return f"{self.run}.{self.device}"

    @property
    def journal_path(self):
        """The child's sample journal (JSON Lines) next to ``result_path``."""
        return journal_path(self.result_path)

    @property
    def key(self):
        """``(name, run, device)``: what identifies a launch across sessions (``--resume``)."""
        return (self.name, self.run, self.device)

    def describe(self):
        """Lines for ``--dry-run``: the command, its env and its cgroup."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        mode = "concurrent" if self.concurrent else "sequential"
        return (f"# {self.group} J{self.job_id} ({mode}, cgroup: {self.cgroup or 'none'}, "
                f"timeout: {self.timeout:g} s)\n{env} {shlex.join(self.argv)}")


def _label(devices):
    return str(devices[0]) if len(devices) == 1 else f"{devices[0]}-{devices[-1]}"


def child_argv(job, run, label, devices, out, dataroot, test_argv, python=None,
               nproc=1):
    """The ``milarun run`` command for one launch (before cgexec/exec prefix)."""
    python = python or sys.executable
    extra = {"run": run, "device": label, "devices": devices,
             "partition": job.partition, "job": job.definition}
    if job.launcher == "torchrun":
        head = [python, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(nproc), "-m", "milarun", "run"]
    else:
        head = [python, "-m", "milarun", "run"]
    argv = head + [job.experiment, "-o", str(out)]
    if dataroot is not None:
        argv += ["-d", str(dataroot)]
    argv += ["--experiment-name", job.full_name, "--job-id", f"{run}.{label}",
             "--extra", json.dumps(extra, sort_keys=True), "--"]
    return argv + list(test_argv)


def plan_job(job, devices, run, outdir, dataroot=None, extra_args=(), use_cgexec=True,
             timeout=None, python=None, session=None):
    """Return the waves (list of lists of ``Launch``) for one run of ``job``.

    Args:
        devices: a ``devices.Devices``.
        session: UTC ``datetime`` stamped into every file name (default: the
            Unix epoch, for tests that only look at command lines).
        extra_args: arguments appended to every test (after ``--``).
        use_cgexec: False for ``--no-cgexec`` (no cgroup wrapping).
        timeout: overrides the job's timeout (seconds) when given.
    """
    test_argv = job.argv() + list(extra_args)
    timeout = float(timeout or job.timeout)
    when = session or datetime.datetime.fromtimestamp(0, datetime.timezone.utc)
    gpu = devices.kind == "gpu"

    def make(devs, concurrent, group, cgroup, nproc=1):
        label = _label(devs) if job.partition != "normal" else "all"
        visible = ",".join(str(d) for d in devs) if gpu else ""
        env = {"CUDA_VISIBLE_DEVICES": visible, "MILARUN_DEVICE": label,
               "MILARUN_RUN": str(run)}
        if gpu:
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA's indices = NVML's (devices.py)
        cg = cgroup if use_cgexec else None
        result = Path(outdir) / result_filename(job.full_name, run, label, True, when)
        fail = Path(outdir) / result_filename(job.full_name, run, label, False, when)
        argv = child_argv(job, run, label, list(devs), result, dataroot, test_argv,
                          python=python, nproc=nproc)
        return Launch(name=job.full_name, job=job, run=run, device=label, devices=list(devs),
                      argv=wrap(argv, cg, job.exec_prefix, use_cgexec), env=env, cgroup=cg,
                      concurrent=concurrent, group=group,
                      log=f"{job.full_name}.J{run}.{label}.log",
                      test_argv=test_argv, timeout=timeout, result_path=result,
                      fail_path=fail)

    idx = list(devices.indices)
    if job.partition == "per-gpu":
        return [[make([i], True, job.full_name,
                      job.cgroup.format(device=i) if job.cgroup else None)
                 for i in idx]]
    if job.partition == "gpu-progression":
        return [[make(idx[:k], False, f"{job.full_name}.{k}", None, nproc=k)]
                for k in range(1, len(idx) + 1)]
    return [[make(idx, False, job.full_name, None, nproc=len(idx))]]


def plan_suite(jobs, devices, repeat, outdir, **kwargs):
    """Waves for every run and job: run 0 of every job, then run 1, and so on."""
    waves = []
    for run in range(repeat):
        for job in jobs:
            waves += plan_job(job, devices, run, outdir, **kwargs)
    return waves
