"""Pure numbers, no I/O: steady state, intervals, effective throughput, energy, the
plausibility checks of a measurement (failing checks and validation flags), anomalies,
and the one flag model of both (:mod:`milarun.measure.flags`).
(A file's schema is checked in :mod:`milarun.formats`.)"""
