"""``milarun keygen PRIVATE PUBLIC``: make an Ed25519 key pair for ``milarun seal --sign``.

Parsing only: the work is :func:`milarun.verify.keys.keygen`'s.
"""

from .options import positional

OPTIONS = (
    positional("private", "Where to write the private key (PEM, mode 0600; keep it secret)"),
    positional(
        "public", "Where to write the public key (PEM, mode 0644; send it with the tender reply)"
    ),
)


def command(opts, rest):
    """Make an Ed25519 key pair: PRIVATE signs bundles (milarun seal --sign), PUBLIC goes to
    the buyer with the tender reply (milarun verify --public-key). Never overwrites a file
    and leaves none behind on an error.
    See docs/tender.md, "Sealing a bundle"."""
    # lazy, for start-up: `milarun --help` imports every cli module (cryptography is slow)
    from ..verify.keys import keygen

    keygen(opts.private, opts.public)
    print(f"milarun: private key {opts.private} (keep it secret: it signs your bundles)")
    print(f"milarun: public key {opts.public} (send it with the tender reply)")
    return 0
