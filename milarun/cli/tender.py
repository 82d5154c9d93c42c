"""``milarun tender BUNDLE... --rules RULES [--prices PRICES.json] [--weights W]``: every
bidder verified and ranked in one table.

Heavy modules (pandas, jinja2) are imported only when the command runs, so ``milarun
--help`` stays fast.
"""

import sys

from .options import option, positional


OPTIONS = (
    positional("bundles", "The bidders' results bundles: a folder (the bidder is named after "
               "it) or NAME=PATH", nargs="+"),
    option("rules", "The tender's rules file: every bundle is verified against it "
           "(milarun verify --rules; docs/tender.md)"),
    option("prices", "Prices file {\"currency\": \"EUR\", \"bidders\": {name: price}}: adds "
           "the price per score point and per node-score point (docs/tender.md)"),
    option("weights", "Weights file for every bidder's score (default: the shipped weights "
           "of the one profile every bundle ran, else every test weighs 1)"),
    option("html", "Also write the ranking as a self-contained HTML page to this file"),
    option("json", "Also write the ranking as JSON to this file"),
)


def command(opts, rest):
    """Verify every bidder's bundle against the tender's rules and rank them in one table.

    Columns: rank, verification (verified / N clause(s) failed), score and node score with
    their 95% intervals, the score by family, failure rate, and with --prices the price,
    price / score and price / node score; then, for each pair of bidders, whether the
    score difference is significant (the Welch test of milarun report --compare). A bidder
    that failed verification is shown, never ranked above one that passed. Exit status 0
    when at least one bidder verified, 1 when none did, 2 on bad input.
    """
    return run_tender(opts.bundles, opts.rules, prices=opts.prices, weights=opts.weights,
                      html=opts.html, json_out=opts.json)


def run_tender(bundles, rules, prices=None, weights=None, html=None, json_out=None,
               stdout=None, warn=None):
    """Build, print (and write as HTML and JSON) the tender; returns the exit code.

    Raises:
        MilarunError: no ``--rules``, or bad input (:func:`milarun.report.tender.build_tender`).
    """
    # lazy, for start-up: `milarun --help` imports every cli module (the report: pandas)
    from ..errors import MilarunError
    from ..formats.terminal import terminal_safe
    from ..report.tender import make_tender

    stdout = stdout or sys.stdout
    warn = warn or sys.stderr
    if not rules:
        raise MilarunError("--rules is required: the tender's rules file every bundle is "
                           "verified against (docs/tender.md)")
    tender, text = make_tender(bundles, rules, prices=prices, weights=weights, html=html,
                               json_out=json_out, warn=warn)
    for line in tender.warnings:
        print(terminal_safe(f"milarun: warning: {line}"), file=warn)
    stdout.write(text)
    if tender.exit_code:
        print("milarun: error: no bidder's bundle verified", file=warn)
    return tender.exit_code
