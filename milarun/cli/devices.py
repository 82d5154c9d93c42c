"""``milarun devices [--json] [--count] [--cpu-slots N]``: what milarun sees on this host."""

import json
import sys

from .options import flag, option


def inventory(cpu_slots=None, root="/", options=None):
    """What ``milarun devices`` prints, as a dict: ``{"backend", "vendor", "driver",
    "runtime", "runtime_name", "devices": [{"index", "visible", "name", "memory_mib",
    "pci_bus_id", "numa_node", "cpus", "parent", "uuid"}], "cpu_slots", "probe": {vendor:
    [what]}, "tried": {backend: why it saw nothing, or which devices it skipped and why}}``.

    Raises:
        SetupError: the host has accelerators that no backend sees, without ``cpu_slots``
            (:func:`milarun.host.devices.discover`).
    """
    # lazy, for start-up: `milarun --help` imports every cli module
    from ..host import accel
    from ..host.accel import probe
    from ..host.devices import discover, find_gpus

    devs = discover(cpu_slots, root=root, options=options)
    _, tried = find_gpus(options=options)
    if devs.kind != "cpu":   # the backend in use: only what it skipped, if anything
        tried = {k: v for k, v in tried.items() if k == devs.backend}
    out = {"backend": devs.backend, "probe": probe.found(root), "tried": tried}
    record = accel.get(devs.backend, **(options or {}).get(devs.backend, {})) \
        .accelerator_record()
    out.update({k: record[k] for k in ("vendor", "driver", "runtime", "runtime_name")})
    out["cpu_slots"] = len(devs) if devs.kind == "cpu" else None
    out["devices"] = [{"index": a.index, "visible": a.visible_id, "name": a.name,
                       "memory_mib": a.memory_mib, "pci_bus_id": a.pci_bus_id,
                       "numa_node": a.numa_node, "cpus": list(a.cpus), "parent": a.parent,
                       "uuid": a.uuid}
                      for a in devs.accelerators]
    return out


def render(inv):
    """``inventory()`` as text lines."""
    from ..host.isolation import format_cpus  # lazy, for start-up

    lines = []
    if inv["backend"] == "cpu":
        lines.append(f"backend: cpu ({inv['cpu_slots']} CPU slot(s); no GPU backend sees a "
                     "device)")
    else:
        runtime = (f", {inv['runtime_name']} {inv['runtime'] or 'unknown'}"
                   if inv["runtime_name"] else "")
        lines.append(f"backend: {inv['backend']} ({inv['vendor']}), driver "
                     f"{inv['driver'] or 'unknown'}{runtime}")
        for d in inv["devices"]:
            mem = "memory unknown" if d["memory_mib"] is None else f"{d['memory_mib']:.0f} MiB"
            where = ", ".join(x for x in (
                d["pci_bus_id"] and f"PCI {d['pci_bus_id']}",
                d["numa_node"] is not None and f"NUMA node {d['numa_node']}",
                d["cpus"] and f"CPUs {format_cpus(d['cpus'])}",
                d["parent"] is not None and f"MIG instance of GPU {d['parent']}") if x)
            lines.append(f"  {d['index']}: {d['name']}, {mem}; visible as {d['visible']}"
                         + (f"; {where}" if where else ""))
    for name, why in sorted(inv["tried"].items()):
        lines.append(f"  {name}: {why}")
    from ..host.accel.probe import describe  # lazy, for start-up

    lines.append("accelerators on the host (whatever the drivers): "
                 + (describe(inv["probe"]) or "none"))
    return lines


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
    from ..launcher.bounds import check_bounds

    check_bounds(1, cpu_slots, None)   # --cpu-slots in 1..cores, as milarun jobs says
    inv = inventory(cpu_slots)
    if opts.count:
        print(len(inv["devices"]) or (cpu_slots or 0))
    elif opts.json_:
        json.dump(inv, sys.stdout, indent=1)
        print()
    else:
        print("\n".join(render(inv)))
    return 0
