"""The bidders file of a tender (``milarun tender --bidders FILE``): every bidder pinned in
one file the buyer writes, read strictly (:func:`milarun.formats.jsonfile.read_json`) and
checked against ``milarun/formats/schemas/bidders.schema.json``::

    {"version": 1,
     "bidders": [{"name": "acme", "bundle": "acme/", "public_key": "keys/acme.pub",
                  "head": "8af4…", "head_received": "2026-11-26T10:49:12Z",
                  "price": 412000, "currency": "EUR"}]}

Beyond the schema (one line naming the file and the key, e.g. ``bidders.2.bundle``):
names are unique; ``price`` and ``currency`` go together and every priced bidder has the
same currency; ``head_received`` needs ``head`` and must be a time; ``bundle`` (a folder)
and ``public_key`` (a file) are resolved against the bidders file's folder and must
exist. What the file is for: ``docs/tender.md``, "The bidders file";
:mod:`milarun.report.tender` verifies each bundle with its own head and key.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from ..errors import ResultFormatError
from .jsonfile import StrPath, check, read_json

#: Largest bidders file read (bytes).
MAX_BIDDERS_BYTES = 1 << 20


@dataclass(frozen=True)
class BidderEntry:
    """One bidder of a bidders file, its paths resolved.

    Attributes:
        name: the bidder's name (:data:`milarun.formats.prices.BIDDER_NAME`).
        bundle: its results folder (a path, resolved against the bidders file's folder).
        public_key: its Ed25519 public key (PEM path, resolved), or None.
        head: the chain head the buyer received (64 lowercase hex digits), or None.
        head_received: when that head arrived (ISO 8601, as written), or None.
        price: its price (a float > 0), or None.
        currency: the price's ISO 4217 code, or None.
        key: its key path in the file (``bidders.2``), for error lines.
    """

    name: str
    bundle: str
    public_key: str | None = None
    head: str | None = None
    head_received: str | None = None
    price: float | None = None
    currency: str | None = None
    key: str | None = None


def _resolve(base: Path, text: str) -> str:
    path = Path(text).expanduser()
    return str(path if path.is_absolute() else base / path)


def read_bidders(path: StrPath) -> tuple[str | None, list[BidderEntry]]:
    """The bidders of ``path``: ``(currency or None, [BidderEntry])`` in the file's order.

    Raises:
        ResultFormatError: unreadable, not UTF-8, not JSON, larger than 1 MiB, a bad or
            unknown key, a duplicate name, a price without a currency (or the reverse),
            two currencies, a ``head_received`` without a head or not a time, a bundle
            folder or public key file that does not exist: one line naming the file
            and the key.
    """
    data = check(
        read_json(
            path, error_cls=ResultFormatError, max_bytes=MAX_BIDDERS_BYTES, what="bidders file"
        ),
        "bidders",
        path=path,
    )
    base = Path(path).parent

    def fail(message: str, i: int, field: str) -> NoReturn:
        raise ResultFormatError(message, path=path, key=f"bidders.{i}.{field}")

    out: list[BidderEntry] = []
    seen: dict[str, int] = {}
    currency: tuple[str, int] | None = None
    for i, b in enumerate(data["bidders"]):
        if b["name"] in seen:
            fail(
                f"{b['name']!r} is also bidders.{seen[b['name']]}'s name: names are unique",
                i,
                "name",
            )
        seen[b["name"]] = i
        if ("price" in b) != ("currency" in b):
            fail(
                "missing (price and currency go together)",
                i,
                "currency" if "price" in b else "price",
            )
        if "currency" in b:
            if currency is not None and b["currency"] != currency[0]:
                fail(
                    f"{b['currency']} is not bidders.{currency[1]}'s currency {currency[0]}: "
                    "every price is in one currency",
                    i,
                    "currency",
                )
            currency = currency or (b["currency"], i)
        if "head_received" in b:
            if "head" not in b:
                fail("missing (head_received is when the head arrived)", i, "head")
            try:
                datetime.datetime.fromisoformat(b["head_received"])
            except ValueError:
                fail(
                    f"{b['head_received']!r} is not a time (ISO 8601: 2026-11-26T10:49:00Z)",
                    i,
                    "head_received",
                )
        bundle = _resolve(base, b["bundle"])
        if not Path(bundle).is_dir():
            fail(f"no such bundle folder: {bundle}", i, "bundle")
        key = None
        if "public_key" in b:
            key = _resolve(base, b["public_key"])
            if not Path(key).is_file():
                fail(f"no such public key file: {key}", i, "public_key")
        out.append(
            BidderEntry(
                name=b["name"],
                bundle=bundle,
                public_key=key,
                head=b["head"].lower() if "head" in b else None,
                head_received=b.get("head_received"),
                price=float(b["price"]) if "price" in b else None,
                currency=b.get("currency"),
                key=f"bidders.{i}",
            )
        )
    return (currency[0] if currency else None), out


__all__ = ["BidderEntry", "MAX_BIDDERS_BYTES", "read_bidders"]
