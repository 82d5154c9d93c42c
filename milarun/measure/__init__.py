"""Pure numbers, no I/O: steady state, intervals, effective throughput, energy, the
plausibility checks of a measurement (failing checks and validation flags), anomalies.
(A file's schema is checked in :mod:`milarun.formats`.)"""
