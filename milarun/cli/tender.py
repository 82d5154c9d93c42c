"""``milarun tender --bidders BIDDERS.json --rules RULES [--weights W]`` (or ``milarun
tender BUNDLE... --rules RULES [--prices PRICES.json]``, every bidder unpinned): every
bidder verified and ranked in one table.

Heavy modules (pandas, jinja2) are imported only when the command runs, so ``milarun
--help`` stays fast.
"""

import sys

from ..errors import MilarunError
from ..formats.terminal import one_line
from .options import option, positional

OPTIONS = (
    positional(
        "bundles",
        "Without --bidders: the bidders' results bundles, a folder (the "
        "bidder is named after it) or NAME=PATH; each is verified without a head or "
        "key (CONSISTENT, NOT PINNED at best)",
        nargs="*",
    ),
    option(
        "bidders",
        'Bidders file {"version": 1, "bidders": [{name, bundle, public_key, '
        "head, head_received, price, currency}]}: each bundle verified with the head "
        "received and the public key it gives (docs/tender.md)",
    ),
    option(
        "rules",
        "The tender's rules file: every bundle is verified against it "
        "(milarun verify --rules; docs/tender.md)",
    ),
    option(
        "prices",
        'With BUNDLE arguments: prices file {"currency": "EUR", "bidders": '
        "{name: price}}: adds the price per score point and per node-score point (with "
        "--bidders, the prices are in the bidders file)",
    ),
    option(
        "weights",
        "Weights file for every bidder's score (default: the shipped weights "
        "of the one profile every bundle ran, else every test weighs 1)",
    ),
    option("html", "Also write the ranking as a self-contained HTML page to this file"),
    option("json", "Also write the ranking as JSON to this file"),
)


def command(opts, rest):
    """Verify every bidder's bundle against the tender's rules and rank them in one table.

    Columns: rank, verification (the verdict's level: VERIFIED / CONSISTENT, NOT PINNED
    / NOT VERIFIED: N clause(s) failed / unreadable), signed, the head's arrival time,
    score and node score with their 95% intervals, the score by family, failure rate,
    and with prices the price, price / score and price / node score; then, for each pair
    of bidders, whether the score difference is significant (the Welch test of milarun
    report --compare). VERIFIED bidders are ranked first, unpinned ones after them
    (marked); a bidder that failed verification is shown without a rank. Exit status 0
    when at least one bidder is VERIFIED, 3 when none is but one is CONSISTENT, NOT
    PINNED, 1 when none is either, 2 on bad input.
    """
    return run_tender(
        opts.bundles,
        opts.rules,
        prices=opts.prices,
        weights=opts.weights,
        html=opts.html,
        json_out=opts.json,
        bidders_file=opts.bidders,
    )


def run_tender(
    bundles,
    rules,
    prices=None,
    weights=None,
    html=None,
    json_out=None,
    stdout=None,
    warn=None,
    bidders_file=None,
):
    """Build, print (and write as HTML and JSON) the tender; returns the exit code.

    Raises:
        MilarunError: no ``--rules``, or bad input (:func:`milarun.report.tender.build_tender`).
    """
    # lazy, for start-up: `milarun --help` imports every cli module (the report: pandas)
    from ..report.tender import make_tender

    stdout = stdout or sys.stdout
    warn = warn or sys.stderr
    if not rules:
        raise MilarunError(
            "--rules is required: the tender's rules file every bundle is "
            "verified against (docs/tender.md)"
        )
    if not bundles and not bidders_file:
        raise MilarunError(
            "no bidder given: milarun tender --bidders BIDDERS.json --rules "
            "RULES (or BUNDLE... for unpinned bidders; docs/tender.md)"
        )
    tender, text = make_tender(
        bundles,
        rules,
        prices=prices,
        weights=weights,
        html=html,
        json_out=json_out,
        warn=warn,
        bidders_file=bidders_file,
    )
    for line in tender.warnings:
        print(one_line(f"milarun: warning: {line}"), file=warn)
    stdout.write(text)
    if tender.exit_code == 3:
        print(
            "milarun: no bidder's bundle VERIFIED: every clause held for "
            f"{sum(b.unpinned for b in tender.bidders)} bidder(s), but none was pinned "
            "to the head received (give each head in --bidders)",
            file=warn,
        )
    elif tender.exit_code:
        print("milarun: error: no bidder's bundle verified", file=warn)
    return tender.exit_code
