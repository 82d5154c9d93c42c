"""The host's network: a free TCP port. No torch here."""

import socket


def free_port(host="", default=None):
    """A TCP port free on ``host`` now (``""``: every address of this host), as the
    kernel picks it; ``default`` when none can be had, or the ``OSError`` when
    ``default`` is None."""
    try:
        with socket.socket() as s:
            s.bind((host, 0))
            return s.getsockname()[1]
    except OSError:
        if default is None:
            raise
        return default
