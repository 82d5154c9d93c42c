"""A command's options, declared as data: one entry each, with its help text.

Each command module (``milarun.cli.<command>``) holds ``OPTIONS``, a tuple of
:func:`positional`, :func:`option` and :func:`flag` entries, next to
``command(opts, rest)``. :func:`add_options` puts them on the command's
argparse parser. Plain argparse, nothing else: ``milarun --help`` and every
``milarun COMMAND --help`` start in a few tens of milliseconds.

``--help`` lists the positional arguments in the order declared, then the
options sorted by name (the order milarun's help has always had). An option
``--some-name`` is stored as ``opts.some_name``; ``int`` and ``float`` options
show ``NUM`` as their value, others ``VALUE``.
"""


class Spec:
    """One argument of a command: what :func:`add_options` needs to add it."""

    __slots__ = ("kind", "name", "help", "type", "default", "flags", "nargs", "repeat")

    def __init__(
        self, kind, name, help, type=None, default=None, flags=(), nargs=None, repeat=False
    ):
        self.kind, self.name, self.help, self.type = kind, name, help, type
        self.default, self.flags, self.nargs = default, tuple(flags), nargs
        self.repeat = repeat


def positional(name, help, nargs=None):
    """A positional argument, shown as ``NAME`` (``nargs="*"``: a list, default empty)."""
    return Spec("positional", name, help, nargs=nargs, default=[] if nargs == "*" else None)


def option(name, help, type=None, default=None, aliases=(), nargs=None, repeat=False):
    """``--name VALUE`` (``--some-name`` for ``some_name``), also spelled as ``aliases``
    (``"-d"``); ``type`` converts the value (``int``, ``float``; default: the string);
    ``nargs="+"``: one or more values, a list; ``repeat``: the option may be given
    again, its values adding to the list (``--family llm --family vision``)."""
    return Spec(
        "option",
        name,
        help,
        type=type,
        default=default,
        flags=("--" + name.replace("_", "-"),) + tuple(aliases),
        nargs=nargs,
        repeat=repeat,
    )


def flag(name, help, flags=None, negate=False):
    """A switch: ``--name`` sets ``opts.name`` to True (default False); ``flags`` replaces
    the spelling. ``negate``: the switch is ``--no-name`` instead, which sets it to False
    (default True)."""
    if negate:
        return Spec("negate", name, help, default=True, flags=("--no-" + name.replace("_", "-"),))
    return Spec("flag", name, help, default=False, flags=flags or ("--" + name.replace("_", "-"),))


def add_options(parser, specs):
    """Add ``specs`` to ``parser``: positionals first, in order, then the others by name."""
    ordered = [s for s in specs if s.kind == "positional"] + sorted(
        (s for s in specs if s.kind != "positional"), key=lambda s: s.name
    )
    for s in ordered:
        if s.kind == "positional":
            parser.add_argument(
                s.name, nargs=s.nargs, metavar=s.name.upper(), default=s.default, help=s.help
            )
        elif s.kind == "flag":
            parser.add_argument(*s.flags, dest=s.name, action="store_true", help=s.help)
        elif s.kind == "negate":
            # in a group of its own, as milarun's help has always shown it
            parser.add_mutually_exclusive_group().add_argument(
                *s.flags, dest=s.name, action="store_false", help=s.help
            )
        else:
            parser.add_argument(
                *s.flags,
                dest=s.name,
                type=s.type,
                default=s.default,
                nargs=s.nargs,
                help=s.help,
                **({"action": "extend"} if s.repeat else {}),
                metavar="NUM" if s.type in (int, float) else "VALUE",
            )
    return parser


def as_argv(specs, values):
    """The arguments that give ``values`` (``{name: value}``, in that order) to a command
    whose options are ``specs``: what its parser reads back into the same values. A flag
    when true (a negated one when false), an option when its value is not None (nor an
    empty list), with its first spelling: ``--name``, then its value (a float as ``%g``)
    or its values; a positional as its value."""
    by_name = {s.name: s for s in specs}
    argv = []
    for name, value in values.items():
        s = by_name[name]
        if s.kind == "flag":
            argv += [s.flags[0]] if value else []
        elif s.kind == "negate":
            argv += [] if value else [s.flags[0]]
        elif value is None or (s.nargs and not value):
            continue
        else:
            words = [
                f"{v:g}" if isinstance(v, float) else str(v)
                for v in (value if s.nargs else [value])
            ]
            argv += words if s.kind == "positional" else [s.flags[0]] + words
    return argv
