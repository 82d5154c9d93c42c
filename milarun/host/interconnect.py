"""The node's network ports for the collectives' expected peak: InfiniBand / RoCE from sysfs.

``/sys/class/infiniband/<device>/ports/<port>/`` holds ``rate`` (``"400 Gb/sec (4X NDR)"``,
parsed by :func:`parse_ib_rate`), ``state`` (``"4: ACTIVE"``)
and ``link_layer`` (``InfiniBand`` or ``Ethernet``: RoCE). ``root`` (default ``/``) lets
the tests point it at a fake tree. No torch.
"""

import re
from pathlib import Path

from .accel.sysfs import read_text

_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec")


def parse_ib_rate(text):
    """Gb/s of an InfiniBand / RoCE port from its sysfs ``rate`` file, e.g.
    ``"400 Gb/sec (4X NDR)"`` -> 400.0, ``"25 Gb/sec (1X EDR)"`` -> 25.0; None when the
    text is not a rate (missing, empty, ``"Unknown"``). Pure."""
    if not isinstance(text, str):
        return None
    m = _RATE.match(text)
    return float(m.group(1)) if m else None


def infiniband_ports(root="/"):
    """Every InfiniBand / RoCE port of the host: ``[{"device", "port", "rate_gbits",
    "state", "active", "link_layer"}]`` sorted by device and port; ``[]`` without
    ``/sys/class/infiniband``. ``rate_gbits`` is None when the rate cannot be read."""
    base = Path(root) / "sys" / "class" / "infiniband"
    out = []
    try:
        devices = sorted(p for p in base.iterdir())
    except OSError:
        return []
    for dev in devices:
        try:
            ports = sorted((dev / "ports").iterdir(), key=lambda p: (len(p.name), p.name))
        except OSError:
            continue
        for port in ports:
            state = read_text(port / "state")
            out.append(
                {
                    "device": dev.name,
                    "port": port.name,
                    "rate_gbits": parse_ib_rate(read_text(port / "rate")),
                    "state": state,
                    "active": bool(state) and "ACTIVE" in state.upper(),
                    "link_layer": read_text(port / "link_layer"),
                }
            )
    return out


def active_rates(ports):
    """The Gb/s of the active ports of :func:`infiniband_ports` (those with a rate)."""
    return [p["rate_gbits"] for p in ports if p["active"] and p["rate_gbits"]]


__all__ = ["parse_ib_rate", "infiniband_ports", "active_rates"]
