"""``milarun`` as a torchrun worker whose collectives are slowed on purpose (tests only).

Run in place of ``-m milarun``: ``torchrun ... tests/fabric_slow.py run
milarun.models.collectives:main ...``. Before every operation of a group that spans two
nodes or more (:func:`milarun.models.collectives._hook_run`), this rank sleeps
``$FABRIC_BASE_S`` (0.02 s: the wire time of every pair, so that a busy test host's
scheduling moves each pair's time by a small fraction), and ``$FABRIC_DELAY_S`` (0.1 s)
more when its node (``$MILARUN_NODE``) is ``$FABRIC_SLOW_NODE`` (a node slow with every
partner), or when it is the first node of ``$FABRIC_SLOW_LINK`` (``a,b``) and the group
holds both (one slow link). Every rank of a collective waits for the slowest, so the
whole group is slowed, as a bad NIC or cable slows it.
"""

import os
import time

from milarun.models import collectives


def _slowed(buf):
    me = os.environ.get("MILARUN_NODE")
    nodes = set(buf.nodes)
    if len(nodes) < 2:
        return
    link = [n for n in os.environ.get("FABRIC_SLOW_LINK", "").split(",") if n]
    delay = float(os.environ.get("FABRIC_BASE_S", "0.02"))
    if me == os.environ.get("FABRIC_SLOW_NODE") or (
        len(link) == 2 and me == link[0] and set(link) <= nodes
    ):
        delay += float(os.environ.get("FABRIC_DELAY_S", "0.1"))
    time.sleep(delay)


collectives._hook_run = _slowed

if __name__ == "__main__":
    from milarun.cli import main

    main(process_entry=True)
