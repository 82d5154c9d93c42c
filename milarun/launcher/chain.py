"""What a ``milarun jobs`` session enters in its folder's manifest, and when.

At the start: the session file, a copy of every profile file the session ran
(``.milarun/profile-<session>/<n>-<name>``, so a buyer can check it against
the tender's and re-plan from it), the plan of launches
(``.milarun/plan-<session>.json``). After each launch: its record (PASS or
FAIL), its log and any journal left behind, or an ``unwritten`` event when its
FAIL record could not be written. At the end: the prepare logs and an ``end``
event with the tally; the chain head is then printed (see
:mod:`milarun.formats.manifest`).

A manifest that cannot be written (full disk, a hostile file in its place) is
said in one line per failure and never stops the suite: the records are the
measurement; verify will name every record left outside the chain.
"""

import os
from pathlib import Path

from ..errors import MilarunError, ProfileError, say
from ..formats.jsonfile import read_bytes
from ..formats.manifest import Manifest
from ..formats.outfile import own_dir, write_atomic
from ..formats.store import write_json_atomic
from ..profile.includes import profile_files
from .session import meta_dir, session_path

#: ``format`` of the plan file.
PLAN_FORMAT = "milarun-plan"
PLAN_VERSION = 1


def launch_entry(lch):
    """The plan file's description of one launch (JSON, no paths outside the folder)."""
    return {
        "name": lch.name,
        "group": lch.group,
        "run": lch.run,
        "device": lch.device,
        "devices": list(lch.devices),
        "nodes": list(lch.nodes or []),
        "job_id": lch.job_id,
        "test_argv": list(lch.test_argv),
        "result": Path(lch.result_path).name,
        "fail": Path(lch.fail_path).name,
        "log": lch.log,
        "concurrent": bool(lch.concurrent),
        "barrier_wave": lch.barrier_wave,
    }


class SessionChain:
    """The session's side of the manifest (see the module's docstring).

    Args:
        outdir: the results folder (absolute).
        on_message: ``f(line)`` for the one-line errors (default: stderr).
    """

    def __init__(self, outdir, on_message=None):
        self.outdir = Path(outdir)
        self.session = None
        self.on_message = on_message or say
        self.manifest = Manifest(outdir)  # ManifestError: a broken chain
        self.failed = 0

    def _try(self, what, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (OSError, ValueError, MilarunError) as exc:
            self.failed += 1
            self.on_message(
                f"milarun: error: manifest {self.manifest.path}: cannot enter "
                f"{what} ({getattr(exc, 'strerror', None) or exc}); it stays "
                "outside the chain"
            )
            return None

    def start(self, session_id, profile, waves, skipped, resume):
        """Enter the session file, the profile's files and the plan of ``waves``
        (``skipped``: launch keys an earlier session already passed) for session
        ``session_id``."""
        self.session = self.manifest.session = session_id
        meta = meta_dir(self.outdir)
        self._try(
            "the session file",
            self.manifest.add,
            "session",
            session_path(self.outdir),
            resume=bool(resume),
        )
        copies = own_dir(meta / f"profile-{self.session}")
        for n, src in enumerate(profile_files(profile)):
            dst = copies / f"{n}-{Path(src).name}"
            self._try(f"profile file {src}", self._copy, src, dst)
        plan = {
            "format": PLAN_FORMAT,
            "version": PLAN_VERSION,
            "session": self.session,
            "resume": bool(resume),
            "launches": [launch_entry(lch) for wave in waves for lch in wave],
            "skipped": sorted([list(map(str, key)) for key in skipped]),
        }
        self._try("the plan", self._plan, meta / f"plan-{self.session}.json", plan)

    def _copy(self, src, dst):
        write_atomic(dst, read_bytes(src, error_cls=ProfileError, what="profile"))
        self.manifest.add("profile", dst)

    def _plan(self, path, plan):
        write_json_atomic(path, plan)
        self.manifest.add("plan", path)

    def outcome(self, o):
        """Enter one launch's outcome: its record, log and left-over journal."""
        lch = o.launch
        key = {"name": lch.name, "run": lch.run, "device": lch.device}
        if o.result_path is not None:
            self._try(
                f"record {o.result_path}",
                self.manifest.add,
                "record",
                o.result_path,
                launch=key,
                success=bool(o.success),
                reason=o.reason,
            )
        else:
            self._try(
                "an unwritten record",
                self.manifest.event,
                "unwritten",
                launch=key,
                reason=o.reason,
                error=(o.write_error or "")[:1000],
            )
        log = self.outdir / "logs" / lch.log
        if lch.log and os.path.isfile(log) and not os.path.islink(log):
            self._try(f"log {log}", self.manifest.add, "log", log, launch=key)
        journal = Path(lch.journal_path)
        if os.path.isfile(journal) and not os.path.islink(journal):
            self._try(f"journal {journal}", self.manifest.add, "journal", journal, launch=key)

    def end(self, outcomes, status):
        """Enter the prepare logs and the ``end`` event; returns the chain head."""
        logs = self.outdir / "logs"
        for log in sorted(logs.glob("*.prepare.log")) if logs.is_dir() else []:
            if log.is_file() and not log.is_symlink():
                self._try(f"log {log}", self.manifest.add, "log", log)
        passed = sum(o.success for o in outcomes)
        cut = sum(o.reason == "interrupted" for o in outcomes)
        self._try(
            "the end of the session",
            self.manifest.event,
            "end",
            status=status,
            passed=passed,
            failed=len(outcomes) - passed - cut,
            interrupted=cut,
            unchained=self.failed,
        )
        return self.manifest.head
