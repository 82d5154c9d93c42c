"""The Python packages milarun runs on, checked against the versions it supports.

The supported versions are those ``pyproject.toml`` declares in
``[project].dependencies`` (read from the installed package's metadata, so they are
written in one place). The lock pins one tested set of them; a GPU node's own
PyTorch image brings another (``scripts/image/``), and milarun installs into it
without replacing its torch (docs/setup.md). Nothing here imports torch: versions
come from the installed distributions' metadata.
"""

from importlib import metadata

from ..errors import MilarunError

#: The distribution whose requirements are checked.
PACKAGE = "milarun"


class UnsupportedStack(MilarunError):
    """A runtime dependency is missing or outside the versions milarun supports."""


def requirements(package=PACKAGE):
    """The runtime requirements of ``package`` (those not behind an extra).

    Returns:
        list of ``packaging.requirements.Requirement``; empty when ``package`` has no
        installed metadata (milarun run from a source tree put on ``sys.path``).
    """
    from packaging.requirements import Requirement  # lazy: only the commands that check

    try:
        declared = metadata.requires(package) or []
    except metadata.PackageNotFoundError:
        return []
    out = []
    for line in declared:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an extra's requirement, or one for another Python or platform
        out.append(req)
    return out


def problems(reqs, version_of=None):
    """What is wrong with the installed versions of ``reqs``.

    Args:
        reqs: requirements as :func:`requirements` returns them.
        version_of: name -> installed version string, or raises
            ``metadata.PackageNotFoundError`` (default: ``importlib.metadata.version``).

    Returns:
        list of one-line strings, e.g. ``"torch 2.10.0 is installed; milarun supports
        torch<2.14,>=2.11"``; empty when every requirement is met. A local version label
        (``2.11.0+cu130``) is ignored, as pip ignores it.
    """
    version_of = version_of or metadata.version
    out = []
    for req in reqs:
        try:
            installed = version_of(req.name)
        except metadata.PackageNotFoundError:
            out.append(f"{req.name} is not installed; milarun needs {req}")
            continue
        if req.specifier and not req.specifier.contains(installed, prereleases=True):
            out.append(f"{req.name} {installed} is installed; milarun supports {req}")
    return out


def check_stack(package=PACKAGE):
    """Refuse to start when a runtime dependency is missing or out of range.

    Called by ``milarun jobs``, ``run`` and ``devices`` before anything runs, so an
    unsupported torch is one line rather than a traceback deep in a workload.

    Raises:
        UnsupportedStack: (exit 2) every problem of :func:`problems`, joined with
            ``"; "``, and where to read how to install (docs/setup.md).
    """
    found = problems(requirements(package))
    if found:
        raise UnsupportedStack("; ".join(found) + " (see docs/setup.md)")
