"""The soak mode of the training tests: periodic checkpoints, one injected fault, the
restart, and the time the fault cost.

``llm_pretrain --soak-every N`` (under torchrun with ``--max-restarts`` at least 1: the
profile's ``"restarts"``) saves the model and optimizer state every ``N`` optimizer steps
with ``torch.distributed.checkpoint`` (DCP: each rank its shard, into a folder every rank
sees, :func:`milarun.models.checkpoint.shared_workdir`). In the job's first attempt one rank,
drawn with ``--seed``, kills itself with SIGKILL after an optimizer step drawn with the same
seed (uniformly from the steps after the first checkpoint to the one before the last): a
GPU or a node lost. torchrun stops the other ranks and starts the job again (its
``--max-restarts``); the new attempt loads the latest complete checkpoint (model, optimizer,
step), passes over the batches already trained on (:class:`milarun.bench.Epochs`' ``skip``)
and trains the remaining steps. The rank that writes the record (rank 0 of the last attempt)
reads what the earlier attempts left in the soak folder and writes the figures.

**The figures** (``metrics``, seconds of wall-clock time, Unix clocks of the ranks that
wrote them):

- ``soak_wall_s``: from the first step of the first attempt to the end of the last step;
- ``soak_productive_s``: the time spent on steps that were kept: every stretch of training
  that ended in a checkpoint a later attempt resumed from, or in the end of the run;
- ``soak_checkpoint_s``: the time spent saving (every save, ``soak_checkpoints`` of them;
  ``soak_save_s`` the median one);
- ``soak_lost_s``, ``soak_lost_steps``: the work done after the last checkpoint before a
  failure, done again after the restart (from the end of that checkpoint to the failure);
- ``soak_restart_s``: from the failure to the first step of the next attempt: torchrun's
  detection and teardown, new processes, the set-up, the checkpoint's load (``soak_load_s``)
  and the pass over the batches already seen;
- ``soak_ettr``, the **effective training time ratio**: ``soak_productive_s /
  soak_wall_s`` (productive training time over wall-clock time, the ratio of Kokolis et al.
  2024, "Revisiting Reliability in Large-Scale Machine Learning Research Clusters",
  arXiv:2410.21680). Wall time is the sum of the four parts, less the moments between them
  (a step's hand-over to the next, well under a millisecond).
- ``soak_every_steps``, ``soak_restarts`` (attempts less one), ``soak_fault_step`` and
  ``soak_fault_rank`` (the injected fault: after that many optimizer steps, on that rank).

The time of the injected fault is what the killed rank wrote just before its kill. A
failure that was not injected (a second one, an out-of-memory kill) has no such time: its
lost work is counted from the attempt's last event in the ledger (its last checkpoint, or
its start) and the rest up to the next attempt's first step is restart time.

**The soak folder** ``milarun-soak-<run id>`` (``--soak-folder``, default the dataroot;
torchrun's run id, the same for every attempt) holds ``latest`` (the name of the latest
complete checkpoint), ``step-<k>/`` (DCP's files and ``train.json``, the step), the
ledger ``ledger.jsonl`` (rank 0's lines: each attempt's start and each checkpoint) and
``fault.json`` (the killed rank's). The folder tells the attempt: none yet, the first (it is
made then); else the attempts that started before, counted in the ledger. torchrun's
restart count does not tell it over nodes: an agent whose own ranks did not fail restarts
them without counting a restart. Its free space must hold two checkpoints (the latest and the
one being written, 12 bytes a parameter each: fp32 parameters and Adam's two moments) before
the first attempt writes anything (else a FAIL with reason ``no-space``). An attempt with no
complete checkpoint to load starts the run over (all the work before is lost). The folder is
removed when the run ends, and after a failure where torchrun has no restart left; else it
stays for the next attempt.

Raises (as FAIL records, the figures measured so far in the record): ValueError (a soak
without torchrun's restarts, or a run too short for a fault), the errors of
:func:`milarun.models.checkpoint.shared_workdir`, DCP's when a checkpoint does not load,
:class:`SoakError` (a ledger that does not hold together, a folder that cannot be named).
"""

import json
import os
import random
import re
import shutil
import signal
import statistics
import time

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from ..errors import MilarunError
from .checkpoint import SPACE_MARGIN, agree, remove_workdir, shared_workdir

#: Bytes a parameter in a soak checkpoint: fp32 parameters (FSDP2 keeps its shards in
#: fp32) and AdamW's first and second moments (4 + 4 + 4).
BYTES_PER_PARAM = 12
#: Checkpoints the folder holds at once: the latest complete one and the one being written.
KEPT = 2
LEDGER = "ledger.jsonl"
FAULT = "fault.json"
LATEST = "latest"
_RUN_ID = re.compile(r"[^A-Za-z0-9._-]")


class SoakError(MilarunError):
    """The soak cannot go on: a broken ledger, a folder that cannot be named."""


def fault_plan(seed, total_steps, every, world_size):
    """``(step, rank)`` of the injected fault: after ``step`` optimizer steps (uniform from
    ``every + 1`` to ``total_steps - 1``: after the first checkpoint, before the end), on
    ``rank`` (uniform over the world), both drawn from ``random.Random(seed)``.

    Raises:
        ValueError: ``total_steps < every + 2``: no step for the fault.
    """
    if total_steps < every + 2:
        raise ValueError(
            f"--soak-every {every} leaves no step for the fault: the run has {total_steps} "
            f"optimizer steps and needs at least {every + 2} (raise --max-count)"
        )
    rng = random.Random(seed)
    return rng.randint(every + 1, total_steps - 1), rng.randrange(world_size)


class Soak:
    """One attempt of a soak run, on one rank.

    Args:
        exp: the experiment (its ``metrics`` get the figures on rank 0).
        world: the :class:`milarun.bench.distributed.World` (``run_id`` names the folder).
        folder: where the soak folder is made (shared by every rank).
        every: optimizer steps between checkpoints (> 0).
        total_steps: optimizer steps of the whole run.
        params: the model's parameter count (for the space check).
        seed: draws the fault (:func:`fault_plan`).

    Raises:
        ValueError: not under torchrun with ``--max-restarts`` ≥ 1, or :func:`fault_plan`'s.
        StorageError, NoSpace: the folder (first attempt).
        SoakError: the fresh folder cannot take the run's name.
    """

    def __init__(self, exp, world, folder, every, total_steps, params, seed):
        if world.max_restarts < 1:
            raise ValueError(
                "--soak-every needs torchrun's restarts: run it as a torchrun job with "
                '"restarts": 1 or more in its profile entry (torchrun --max-restarts)'
            )
        self.exp, self.world, self.every, self.total = exp, world, every, total_steps
        self.fault = fault_plan(seed, total_steps, every, world.size)
        self.path = os.path.join(
            folder, "milarun-soak-" + _RUN_ID.sub("_", world.run_id or "none")[:100]
        )
        # Which attempt this is, from the folder (rank 0 reads it for all): torchrun's restart
        # count is not the same on every node (an agent whose ranks did not fail restarts
        # them without counting a restart).
        seen = None
        if world.rank == 0 and os.path.isdir(self.path):
            seen = sum(e.get("kind") == "start" for e in self._ledger())
        seen = _broadcast(world, seen)
        if seen is None:
            need = KEPT * BYTES_PER_PARAM * params + SPACE_MARGIN
            self._rename(shared_workdir(world, folder, "soak", need), self.path)
        self.attempt = seen or 0
        self.start_step = 0
        self.load_s = None
        self._mark = None  # the start of the stretch of training not yet saved
        self._kept_s = 0.0  # this attempt's saved stretches
        self._first = None

    def _rename(self, made, path):
        """Give the fresh folder the run's name (the next attempts find it by that name)."""
        problem = None
        if self.world.rank == 0:
            try:
                os.rename(made, path)
            except OSError as exc:
                shutil.rmtree(made, ignore_errors=True)
                problem = (SoakError, f"{path}: cannot name the soak folder ({exc.strerror})")
        agree(self.world, problem)

    # --- the attempt's start ------------------------------------------------------------

    def resume(self, model, optimizer):
        """Load the latest complete checkpoint into ``model`` and ``optimizer``; returns the
        optimizer steps it holds (0 in the first attempt, or where no checkpoint was
        completed: the run starts over, and everything before is lost work)."""
        latest = self._read(LATEST) if self.attempt else None
        if not latest:
            return 0
        where = os.path.join(self.path, latest.strip())
        t0 = time.time()
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=where)
        set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
        self.load_s = time.time() - t0
        with open(os.path.join(where, "train.json")) as f:
            self.start_step = int(json.load(f)["step"])
        self.exp.metrics["soak_load_s"] = self.load_s
        return self.start_step

    def wrap(self, steps):
        """``steps`` (the training loop's iterable), calling :meth:`started` when the first
        item comes, after the start barrier and the first batch."""
        for i, item in enumerate(steps):
            if i == 0:
                self.started()
            yield item

    def started(self):
        """Call at the first micro-batch of the attempt (after the start barrier): the
        stretch of training begins; rank 0 notes the attempt in the ledger."""
        self._first = self._mark = time.time()
        if self.world.rank == 0:
            self._log(
                {
                    "kind": "start",
                    "attempt": self.attempt,
                    "t_first": self._first,
                    "resumed_step": self.start_step,
                    "load_s": self.load_s,
                }
            )

    # --- after each optimizer step ------------------------------------------------------

    def after_step(self, step, model, optimizer, pause):
        """After optimizer step ``step`` (1-based over the run): a checkpoint every
        ``every`` steps (not at the last), inside ``pause()`` (out of the sample windows),
        then the fault if this is its step and rank in the first attempt."""
        if step % self.every == 0 and step < self.total:
            with pause():
                self._save(step, model, optimizer)
        if self.attempt == 0 and (step, self.world.rank) == self.fault:  # the first attempt
            self._write(FAULT, {"rank": self.world.rank, "step": step, "t": time.time()})
            os.kill(os.getpid(), signal.SIGKILL)

    def _save(self, step, model, optimizer):
        t0 = time.time()
        trained = t0 - self._mark
        name = f"step-{step}"
        where = os.path.join(self.path, name)
        model_state, optim_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=where)
        if self.world.size > 1:
            dist.barrier()  # every shard written before rank 0 calls it complete
        if self.world.rank == 0:
            self._write(os.path.join(name, "train.json"), {"step": step})
            previous = self._read(LATEST)
            self._write(LATEST, name)
            if previous and previous.strip() != name:
                shutil.rmtree(os.path.join(self.path, previous.strip()), ignore_errors=True)
        t1 = time.time()
        self._kept_s += trained
        self._mark = t1
        if self.world.rank == 0:
            self._log(
                {
                    "kind": "checkpoint",
                    "attempt": self.attempt,
                    "step": step,
                    "trained_s": trained,
                    "save_s": t1 - t0,
                    "t_end": t1,
                }
            )

    # --- the end ------------------------------------------------------------------------

    def finish(self, ok):
        """The run's end on this rank: rank 0 writes the figures into ``metrics``; the
        folder is removed where no restart follows (``ok``, or torchrun's last attempt).
        Every rank calls it."""
        if self._first is None:  # failed before its first step: it counts from now
            self.started()
        end = time.time()
        if self.world.rank == 0:
            try:
                self.exp.metrics.update(self.figures(end, ok))
            except SoakError:
                if ok:
                    raise  # else the failure that ended the run is the one to tell
        if ok or self.world.restart_count >= self.world.max_restarts:
            remove_workdir(self.world, self.path, ok)

    def figures(self, end, ok):
        """The ``soak_*`` metrics (module docstring) from the ledger of the earlier attempts
        and this one's timings, ``end`` its last step's end (Unix time). Where the run did
        not end (``ok`` false), the stretch since the last checkpoint counts as lost.

        Raises:
            SoakError: the ledger of a restarted attempt has no line of an earlier attempt.
        """
        lines = self._ledger()
        starts = {e["attempt"]: e for e in lines if e.get("kind") == "start"}
        checkpoints = [e for e in lines if e.get("kind") == "checkpoint"]
        if any(a not in starts for a in range(self.attempt + 1)):
            raise SoakError(f"{self.path}/{LEDGER}: an attempt's start is missing")
        fault = _json(self._read(FAULT)) or {}
        productive = lost = restart = 0.0
        lost_steps = 0
        for a in range(self.attempt):
            resumed = int(starts[a + 1]["resumed_step"])
            mine = [c for c in checkpoints if c["attempt"] == a]
            kept = [c for c in mine if int(c["step"]) <= resumed]
            productive += sum(float(c["trained_s"]) for c in kept)
            mark = float(kept[-1]["t_end"]) if kept else float(starts[a]["t_first"])
            last = max([mark] + [float(c["t_end"]) for c in mine])
            failed = float(fault["t"]) if a == 0 and "t" in fault else last
            lost += max(0.0, failed - mark)
            if a == 0 and "step" in fault:
                lost_steps += int(fault["step"]) - resumed
            restart += max(0.0, float(starts[a + 1]["t_first"]) - failed)
        tail = end - self._mark
        if ok:
            productive += self._kept_s + tail
        else:
            productive += self._kept_s
            lost += tail
        saves = [float(c["save_s"]) for c in checkpoints]
        wall = end - float(starts[0]["t_first"])
        return {
            "soak_every_steps": self.every,
            "soak_restarts": self.attempt,
            "soak_fault_step": self.fault[0],
            "soak_fault_rank": self.fault[1],
            "soak_checkpoints": len(saves),
            "soak_save_s": statistics.median(saves) if saves else None,
            "soak_checkpoint_s": sum(saves),
            "soak_productive_s": productive,
            "soak_lost_s": lost,
            "soak_lost_steps": lost_steps,
            "soak_restart_s": restart if self.attempt else None,
            "soak_wall_s": wall,
            "soak_ettr": productive / wall if wall > 0 else None,
        }

    # --- the folder's small files -------------------------------------------------------

    def _ledger(self):
        text = self._read(LEDGER) or ""
        return [e for e in map(_json, text.splitlines()) if isinstance(e, dict)]

    def _log(self, entry):
        with open(os.path.join(self.path, LEDGER), "a") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def _write(self, name, value):
        """Write ``value`` (a string, else JSON) to ``name`` in the folder, durably and
        atomically (a temporary file renamed over it)."""
        path = os.path.join(self.path, name)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(value if isinstance(value, str) else json.dumps(value))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def _read(self, name):
        try:
            with open(os.path.join(self.path, name)) as f:
                return f.read()
        except FileNotFoundError:
            return None


def _broadcast(world, value):
    """Rank 0's ``value`` on every rank."""
    shared = [value]
    if world.size > 1:
        dist.broadcast_object_list(shared, src=0)
    return shared[0]


def _json(text):
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None
