"""``milarun audit plan|check``: audit reruns of a vendor's bundle on the delivered hardware.

Parsing only: the work is :mod:`milarun.verify.audit`'s.
"""

import json
import sys

from ..errors import MilarunError
from .options import option, positional

#: The sub-actions and the folders each takes.
ACTIONS = {"plan": ("OUTDIR",), "check": ("OUTDIR", "AUDITDIR")}

OPTIONS = (
    positional(
        "action",
        "plan: pick launches of the bundle and write the audit profile; "
        "check: compare the rerun with the bundle",
    ),
    positional(
        "folders",
        "plan: the vendor's results folder (OUTDIR); check: OUTDIR and the "
        "rerun's results folder (AUDITDIR)",
        nargs="*",
    ),
    option("sample", "plan: how many launches to rerun (K, at least 1)", type=int),
    option(
        "seed",
        "plan: the buyer's random seed (an integer, recorded in the plan: the "
        "same seed picks the same launches)",
        type=int,
    ),
    option("rules", "plan: the tender's rules file, whose SHA-256 the plan records"),
    option(
        "expect_head",
        "plan: the chain head the bidder sent (64 hex digits); the plan is refused when "
        "the bundle's head is another, and records that it was pinned",
    ),
    option(
        "tolerance",
        "plan: how much slower than the vendor's rate a rerun may be before "
        "Welch's test can fail it, a fraction in [0, 1) (default 0.05)",
        type=float,
    ),
    option(
        "out",
        "plan: the audit profile to write (the plan goes next to it, X.plan.json)",
        aliases=("-o",),
    ),
    option("json", "check: also write the outcome as JSON to this file"),
)


def command(opts, rest):
    """Audit reruns on the delivered hardware (docs/tender.md).

    milarun audit plan OUTDIR --sample K --seed S -o AUDIT.json [--rules R] [--tolerance F]
    [--expect-head HEAD]
    picks K of the vendor's successful launches at random with your seed and writes a
    profile that reruns exactly those tests (run it with the printed milarun jobs command).

    milarun audit check OUTDIR AUDITDIR [--json FILE] checks that the rerun ran on the
    bundle's hardware (the same GPU UUIDs and serials) and that each launch's throughput is
    reproduced (Welch's t-test as in report --compare). Exit 0: every launch reproduced and
    the identity matched; 1: a clause failed; 2: bad input.
    """
    if rest:
        raise MilarunError("audit takes no arguments after '--'")
    action = opts.action
    if action not in ACTIONS:
        raise MilarunError(f"unknown action {action!r}: plan or check", key="action")
    want = ACTIONS[action]
    if len(opts.folders) != len(want):
        raise MilarunError(
            f"audit {action} takes {' '.join(want)}, got {len(opts.folders)} folder(s)",
            key="folders",
        )
    # lazy, for start-up: `milarun --help` imports every cli module
    from ..verify import audit

    if action == "plan":
        for name in ("sample", "seed", "out"):
            if getattr(opts, name) is None:
                raise MilarunError(f"audit plan needs --{name}", key=name)
        tolerance = audit.DEFAULT_TOLERANCE if opts.tolerance is None else opts.tolerance
        plan = audit.plan_audit(
            opts.folders[0],
            opts.sample,
            opts.seed,
            opts.out,
            rules=opts.rules,
            tolerance=tolerance,
            expect_head=opts.expect_head,
        )
        pinned = (
            "pinned: the head you received"
            if plan["pinned"]
            else "not pinned: compare it with the head the bidder sent, or give --expect-head"
        )
        print(
            f"milarun: audit plan: {len(plan['chosen'])} of {plan['launches']} launch(es) "
            f"picked with seed {plan['seed']} from chain head {plan['head']} ({pinned})"
        )
        for c in plan["chosen"]:
            print(f"  {c['name']} J{c['run']} device {c['device']}: {c['record']}")
        for job, what in plan["review"].items():
            for key, value in what.items():
                print(
                    f"milarun: read before running: {job} {key} (from the vendor's records): "
                    f"{json.dumps(value)}"
                )
        print(
            f"milarun: wrote {opts.out} and {audit.plan_path(opts.out)}; on the delivered "
            "machine run:"
        )
        print("  " + " ".join(plan["command"]))
        print(f"then: milarun audit check {opts.folders[0]} AUDITDIR")
        return 0
    verdict, rows, plan = audit.check_audit(*opts.folders)
    sys.stdout.write(audit.format_check(verdict, rows))
    if opts.json:
        from ..formats.store import write_json_atomic  # why: only with --json

        try:
            write_json_atomic(opts.json, audit.check_json(verdict, rows, plan))
        except MilarunError:
            raise
        except OSError as exc:
            raise MilarunError(f"cannot write ({exc.strerror})", path=opts.json)
    return verdict.exit_code
