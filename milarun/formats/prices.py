"""The prices file of a tender (``milarun tender --prices FILE``): each bidder's price in
one currency, read strictly (:func:`milarun.formats.jsonfile.read_json`) and checked
against ``milarun/formats/schemas/prices.schema.json``::

    {"currency": "EUR", "description": "price of one node, delivered, 3 years support",
     "bidders": {"acme": 412000, "globex": 389500}}

What the prices are used for (price per score point and per node-score point) and how
bidders are named: ``docs/tender.md``, "Ranking the bidders (the buyer)", and
:mod:`milarun.report.tender`.
"""

import re

from ..errors import ResultFormatError
from .jsonfile import check, load_schema, read_json

#: Largest prices file read (bytes).
MAX_PRICES_BYTES = 1 << 20

#: What a bidder's name may be (the schema's ``$defs.bidder_name``, read from there).
BIDDER_NAME = re.compile(load_schema("prices")["$defs"]["bidder_name"]["pattern"])


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


__all__ = ["BIDDER_NAME", "MAX_PRICES_BYTES", "read_prices"]
