"""The kernel's files (sysfs, procfs, the cgroup file system): one reader. No torch here."""

from pathlib import Path


def read_text(path):
    """A kernel file's stripped text; None when it is missing, unreadable or not UTF-8
    (this never raises)."""
    try:
        return Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
