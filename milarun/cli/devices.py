"""``milarun devices [--json] [--count] [--cpu-slots N]``: what milarun sees on this host
(options only; the inventory: :mod:`milarun.host.inventory`)."""

import json
import sys

from .options import flag, option

OPTIONS = (
    flag("json_", "Print the inventory as JSON", flags=("--json",)),
    flag("count", "Print only the number of GPUs (none: the --cpu-slots value, else 0)"),
    option("cpu_slots", "CPU slots to report when no GPU backend sees a device", type=int),
)


def command(opts, rest):
    """Print the devices milarun would test, their backend, driver and runtime, their
    memory, PCI bus id, NUMA node and local CPUs (what the student cgroups use), and
    the accelerators the host has whatever its drivers. Exit 2 when the host has
    accelerators that no backend sees (unless --cpu-slots)."""
    cpu_slots = opts.cpu_slots

    # lazy: `milarun devices --help` loads only this command
    from ..host.inventory import inventory, render
    from ..host.stack import check_stack
    from ..launcher.bounds import check_bounds

    check_stack()
    check_bounds(1, cpu_slots, None)  # --cpu-slots in 1..cores, as milarun jobs says
    inv = inventory(cpu_slots)
    if opts.count:
        print(len(inv["devices"]) or (cpu_slots or 0))
    elif opts.json_:
        json.dump(inv, sys.stdout, indent=1)
        print()
    else:
        print("\n".join(render(inv)))
    return 0
