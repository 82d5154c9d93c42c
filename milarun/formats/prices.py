"""Prices: the one price of ``milarun report --price`` (:func:`check_price`) and the prices
file of a tender (``milarun tender --prices FILE``): each bidder's price in one currency,
read strictly (:func:`milarun.formats.jsonfile.read_json`) and checked against
``milarun/formats/schemas/prices.schema.json``::

    {"currency": "EUR", "description": "price of one node, delivered, 3 years support",
     "bidders": {"acme": 412000, "globex": 389500}}

What the prices are used for (price per score point and per node-score point) and how
bidders are named: ``docs/tender.md``, "Ranking the bidders (the buyer)", and
:mod:`milarun.report.tender`.
"""

from __future__ import annotations

import math
import re
from typing import Any

from ..errors import MilarunError, ResultFormatError
from .jsonfile import check, load_schema, read_json

#: Largest prices file read (bytes).
MAX_PRICES_BYTES = 1 << 20

#: What a bidder's name may be (the schema's ``$defs.bidder_name``, read from there).
BIDDER_NAME = re.compile(load_schema("prices")["$defs"]["bidder_name"]["pattern"])


def check_price(price: Any) -> float:
    """Return ``price`` (``--price``, dollars) as a float when it is a finite number > 0.

    Raises:
        MilarunError: anything else (0, negative, NaN, inf, 1e400 which parses as inf).
    """
    try:
        value = float(price)
    except (TypeError, ValueError, OverflowError):
        value = math.nan
    if isinstance(price, bool) or not (math.isfinite(value) and value > 0):
        raise MilarunError(
            f"--price must be a finite positive number of dollars, not {price!r}"[:120]
        )
    return value


def read_prices(path):
    """The prices of ``path``: ``(currency, {bidder: price})``, prices as floats > 0.

    Raises:
        ResultFormatError: unreadable, not UTF-8, not JSON, larger than 1 MiB, or a bad
            key (one line naming the file and the key).
    """
    data = check(
        read_json(
            path, error_cls=ResultFormatError, max_bytes=MAX_PRICES_BYTES, what="prices file"
        ),
        "prices",
        path=path,
    )
    return data["currency"], {name: float(price) for name, price in data["bidders"].items()}


__all__ = ["BIDDER_NAME", "MAX_PRICES_BYTES", "check_price", "read_prices"]
