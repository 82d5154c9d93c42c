"""milarun: a deep-learning server benchmark.

The parent side (profile → plan → launch) never imports torch; only
``milarun.bench`` and ``milarun.models`` do, inside the child process.
"""

__version__ = "0.1.0"
