"""``milarun seal OUTDIR [--sign PRIVATE_KEY] [--weights WEIGHTS.json]``: close a results
folder into a bundle (``bundle.json``, and its signature with ``--sign``).

Parsing only: the work is :func:`milarun.verify.seal.seal`'s.
"""

from .options import option, positional

OPTIONS = (
    positional("outdir", "The results folder of milarun jobs to seal"),
    option(
        "sign",
        "Ed25519 private key (PEM, from milarun keygen): also write "
        "OUTDIR/bundle.json.sig, the signature of bundle.json",
    ),
    option(
        "weights",
        "Weights file the buyer scores with: copied to "
        "OUTDIR/.milarun/weights.json and entered in the chain",
    ),
)


def command(opts, rest):
    """Seal a results folder: write OUTDIR/bundle.json with the manifest's chain head, the
    hardware identity of every node, and the profile and weights hashes; with --sign,
    OUTDIR/bundle.json.sig. Refuses a folder without a manifest or with a broken chain, one
    a session is still writing into, or one already sealed (never overwritten). See
    docs/tender.md, "Sealing a bundle"."""
    # lazy, for start-up: `milarun --help` imports every cli module (cryptography is slow)
    from ..verify.seal import seal

    seal(opts.outdir, sign=opts.sign, weights=opts.weights)
    return 0
