"""The machine: device backends (``accel``), devices, cgroups and CPU lists, host
facts, parent-death supervision."""
