"""User-facing errors.

Every bad input (profile, job name, dataroot, result file, weights, baseline)
raises one of these. The CLI prints ``milarun: error: <message>`` and exits
with ``exit_code``; the traceback is shown only with ``--verbose``.

:func:`say` prints one line to stderr for the launcher's side (the launch loop, the
barrier server, the CLI): the lowest layer, so that every layer above may use it.
"""

import sys


def say(text, stream=None):
    """Print one line to ``stream`` (stderr); never raises (a closed SSH session gives EIO)."""
    stream = stream or sys.stderr
    try:
        print(text, file=stream, flush=True)
    except (OSError, ValueError):
        pass


class MilarunError(Exception):
    """A problem the user can fix. ``str(err)`` is the one line shown.

    Attributes:
        exit_code: process exit status the CLI uses (2 for bad input).
    """

    exit_code = 2

    def __init__(self, message, *, path=None, key=None):
        parts = []
        if path is not None:
            parts.append(str(path))
        if key is not None:
            parts.append(str(key))
        prefix = ": ".join(parts)
        super().__init__(f"{prefix}: {message}" if prefix else message)
        self.path = path
        self.key = key


class ProfileError(MilarunError):
    """A job profile is malformed or names something unknown."""


class ResultFormatError(MilarunError):
    """A result, summary, baseline or weights file cannot be read."""


class SetupError(MilarunError):
    """The host is not ready: missing cgroups, dataroot, outdir or tools."""
