"""Pure numbers, no I/O: steady state, intervals, effective throughput, energy,
validation flags, anomalies."""
