"""coleo's command lines, with every value taken literally.

coleo turns an option value of the form ``:module:code`` into
``eval(code, vars(__import__(module)))`` (and ``:code`` into an eval in its
``eval_env``) for every option that is not typed ``str``. A result record's
``call.argv`` or ``dataroot``, replayed by ``milarun rerun``, or a profile's
``arguments``, would then run whatever Python a vendor wrote. milarun never
uses that feature: every value is a string converted by its declared type
(``int``, ``float``, ...), nothing else. The workloads' options (the only CLI
milarun still builds with coleo) take ``make_cli`` from here.
"""

from collections.abc import Callable
from typing import Any

import coleo.cli as _coleo_cli


def _literal_resolver(self: Any, typ: Any) -> Callable[[str], Any]:
    """coleo's ``Configurator.resolver`` without evaluation: ``arg`` as is for
    an untyped or ``str`` option, else ``typ(arg)`` (ValueError → argparse's
    one-line usage error)."""

    def resolve(arg: str) -> Any:
        return arg if typ is None or typ is str else typ(arg)

    resolve.__name__ = getattr(typ, "__name__", str(typ))
    return resolve


# coleo builds each option's argparse ``type`` from this method: replacing it
# here is the one place that holds for every CLI milarun makes.
_coleo_cli.Configurator.resolver = _literal_resolver

make_cli = _coleo_cli.make_cli
