"""``milarun summary RESULTS [-o SUMMARY.json]``: group results by test, with statistics.

Heavy modules (pandas, matplotlib, jinja2) are never imported here, so
``milarun --help`` stays fast.
"""

import json
import sys

from ..errors import MilarunError
from .options import option, positional

OPTIONS = (
    positional("results", "The results directory"),
    option("out", "Output file (default: print the JSON on stdout)", aliases=("-o",)),
)


def command(opts, rest):
    """Summarize a results directory (versioned JSON; also usable as a baseline)."""
    return run_summary(opts.results, opts.out)


def run_summary(results, out=None, warn=None):
    """Summarize ``results`` into ``out`` (a path) or stdout; returns the exit code.

    Skipped files are listed on ``warn`` (default: stderr).
    """
    warn = warn or sys.stderr
    # lazy, for start-up: `milarun --help` imports every cli module
    from ..analysis.summary import summarize_dir
    from ..formats.summary import check_summary, write_summary

    summary, _ = summarize_dir(results, warn=warn)
    if out:
        try:
            write_summary(summary, out)
        except MilarunError:  # UnsafeFileError: a symlink, FIFO or device at ``out``
            raise
        except OSError as exc:
            raise MilarunError(f"cannot write ({exc.strerror})", path=out)
    else:
        check_summary(summary)
        json.dump(summary, sys.stdout, indent=1, allow_nan=False)
        sys.stdout.write("\n")
    return 0
