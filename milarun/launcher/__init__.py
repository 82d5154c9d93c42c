"""The parent's side of a run: the suite of ``milarun jobs`` and its options' bounds,
launches, process groups, outcomes, prepare, preflight and dry run, fan-out over
ssh/srun, progress, the session file."""
