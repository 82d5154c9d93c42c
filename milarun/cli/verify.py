"""``milarun verify OUTDIR [--rules R] [--expect-head HEX] [--public-key PUB] [--html F]
[--json F]``: check a vendor's results bundle, clause by clause.

Heavy modules (jinja2) are imported only when the command runs.
"""

import json
import sys

from ..errors import MilarunError
from .options import option, positional

OPTIONS = (
    positional("outdir", "The results folder (the vendor's bundle)"),
    option(
        "rules",
        "Tender rules file (docs/tender.md, 'The rules file'): judge compliance "
        "and the performance clauses too",
    ),
    option(
        "expect_head",
        "The manifest chain head the vendor sent when the run ended "
        "(64 hex digits): the bundle's head must equal it",
    ),
    option(
        "public_key",
        "The vendor's Ed25519 public key (PEM, from milarun keygen): "
        "bundle.json.sig must be its valid signature of bundle.json",
    ),
    option("html", "Also write the verdict as an HTML page to this file"),
    option("json", "Also write the verdict as JSON to this file"),
)


def command(opts, rest):
    """Verify a results bundle: integrity (hash chain, files, seal, signature),
    completeness (every planned launch has exactly one outcome), compliance (overrides
    listed; judged against --rules), consistency (statistics recomputed from the raw
    samples, times, barrier, energy, host facts) and, with --rules, the performance
    clauses. Prints the verdict clause by clause and its level; exit status 0 when
    VERIFIED (every clause held, the head pinned with --expect-head), 1 when a clause
    failed, 3 when every clause held but no head was pinned (CONSISTENT, NOT PINNED),
    2 on bad input (docs/tender.md)."""
    return run_verify(
        opts.outdir,
        rules=opts.rules,
        expect_head=opts.expect_head,
        public_key=opts.public_key,
        html=opts.html,
        json_out=opts.json,
    )


def run_verify(
    outdir, rules=None, expect_head=None, public_key=None, html=None, json_out=None, stdout=None
):
    """Verify ``outdir``, print the text verdict on ``stdout``, write the HTML and JSON
    files asked for; returns the exit status (0 VERIFIED, 1 a clause failed, 3 every
    clause held but the head was not pinned: :attr:`Verdict.exit_code`).

    Raises:
        MilarunError: bad input (rules file, key, --expect-head, folder), or an output
            file that cannot be written.
    """
    # lazy, for start-up: `milarun --help` imports every cli module
    from ..formats.outfile import write_atomic
    from ..report.verify import render_html, render_text
    from ..verify.check import verify_bundle

    stdout = stdout or sys.stdout
    verdict = verify_bundle(outdir, rules=rules, expect_head=expect_head, public_key=public_key)
    stdout.write(render_text(verdict))
    for path, make in (
        (html, lambda: render_html(verdict)),
        (json_out, lambda: json.dumps(verdict.to_json(), indent=1) + "\n"),
    ):
        if path:
            try:
                write_atomic(path, make().encode("utf-8"))
            except MilarunError:
                raise
            except OSError as exc:
                raise MilarunError(f"cannot write ({exc.strerror})", path=path)
    return verdict.exit_code
