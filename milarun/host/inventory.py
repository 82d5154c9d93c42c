"""What ``milarun devices`` shows: the inventory of the devices milarun sees on this host,
as a dict and as text lines (:mod:`milarun.cli.devices` parses the options)."""

from . import accel
from .accel import probe
from .accel.probe import describe
from .devices import discover, find_gpus
from .isolation import format_cpus


def inventory(cpu_slots=None, root="/", options=None):
    """What ``milarun devices`` prints, as a dict: ``{"backend", "vendor", "driver",
    "runtime", "runtime_name", "devices": [{"index", "visible", "name", "memory_mib",
    "pci_bus_id", "numa_node", "cpus", "parent", "uuid"}], "cpu_slots", "probe": {vendor:
    [what]}, "tried": {backend: why it saw nothing, or which devices it skipped and why}}``.

    Raises:
        SetupError: the host has accelerators that no backend sees, without ``cpu_slots``
            (:func:`milarun.host.devices.discover`).
    """
    devs = discover(cpu_slots, root=root, options=options)
    _, tried = find_gpus(options=options)
    if devs.kind != "cpu":  # the backend in use: only what it skipped, if anything
        tried = {k: v for k, v in tried.items() if k == devs.backend}
    out = {"backend": devs.backend, "probe": probe.found(root), "tried": tried}
    record = accel.get(devs.backend, **(options or {}).get(devs.backend, {})).accelerator_record()
    out.update({k: record[k] for k in ("vendor", "driver", "runtime", "runtime_name")})
    out["cpu_slots"] = len(devs) if devs.kind == "cpu" else None
    out["devices"] = [
        {
            "index": a.index,
            "visible": a.visible_id,
            "name": a.name,
            "memory_mib": a.memory_mib,
            "pci_bus_id": a.pci_bus_id,
            "numa_node": a.numa_node,
            "cpus": list(a.cpus),
            "parent": a.parent,
            "uuid": a.uuid,
        }
        for a in devs.accelerators
    ]
    return out


def render(inv):
    """``inventory()`` as text lines."""
    lines = []
    if inv["backend"] == "cpu":
        lines.append(f"backend: cpu ({inv['cpu_slots']} CPU slot(s); no GPU backend sees a device)")
    else:
        runtime = (
            f", {inv['runtime_name']} {inv['runtime'] or 'unknown'}" if inv["runtime_name"] else ""
        )
        lines.append(
            f"backend: {inv['backend']} ({inv['vendor']}), driver "
            f"{inv['driver'] or 'unknown'}{runtime}"
        )
        for d in inv["devices"]:
            mem = "memory unknown" if d["memory_mib"] is None else f"{d['memory_mib']:.0f} MiB"
            where = ", ".join(
                x
                for x in (
                    d["pci_bus_id"] and f"PCI {d['pci_bus_id']}",
                    d["numa_node"] is not None and f"NUMA node {d['numa_node']}",
                    d["cpus"] and f"CPUs {format_cpus(d['cpus'])}",
                    d["parent"] is not None and f"MIG instance of GPU {d['parent']}",
                )
                if x
            )
            lines.append(
                f"  {d['index']}: {d['name']}, {mem}; visible as {d['visible']}"
                + (f"; {where}" if where else "")
            )
    for name, why in sorted(inv["tried"].items()):
        lines.append(f"  {name}: {why}")
    lines.append(
        "accelerators on the host (whatever the drivers): " + (describe(inv["probe"]) or "none")
    )
    return lines
