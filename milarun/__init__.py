"""milarun: a deep-learning server benchmark.

The parent side (profile → plan → launch) never imports torch; only
``milarun.bench`` and ``milarun.models`` do, inside the child process.
"""

import os as _os

__version__ = "0.1.0"

#: This process's parent when milarun was first imported: ``milarun.host.supervise``
#: compares it after asking for a parent-death signal, to catch a parent (a
#: torchrun agent) that died while the process was still starting.
PARENT_AT_START = _os.getppid()
