"""The parent's side of a run: launches, process groups, outcomes, prepare, preflight
and dry run, fan-out over ssh/srun, progress, the session file."""
