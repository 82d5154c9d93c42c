"""Options every experiment accepts (declared with coleo; their defaults are those of the
child protocol, :data:`milarun.formats.child.COMMON_DEFAULTS`)."""

from coleo import Option, default, tooled

from ..formats.child import COMMON_DEFAULTS as _DEFAULTS


@tooled
def common_options():
    """Return the options shared by all models as a dict.

    ``max_count`` (items), ``min_steady`` (s), ``sample_duration`` (s), ``warmup`` (windows),
    ``seed``, ``device`` (``auto``, ``cpu``, ``cuda`` or ``xpu``), ``monitor_interval`` (s),
    ``no_instrument``, ``profile_trace`` (folder or None), ``profile_steps`` (steps).
    """
    # Stop after this many items (examples) have been processed
    max_count: Option & int = default(_DEFAULTS["max_count"])
    # Keep training past max-count until the steady state lasts this many seconds (0: off; not with --no-instrument)
    min_steady: Option & float = default(_DEFAULTS["min_steady"])
    # Length of one sample window, in seconds
    sample_duration: Option & float = default(_DEFAULTS["sample_duration"])
    # Number of leading sample windows flagged as warm-up
    warmup: Option & int = default(_DEFAULTS["warmup"])
    # Random seed
    seed: Option & int = default(_DEFAULTS["seed"])
    # Device: auto (cuda, else xpu, when available), cpu, cuda or xpu
    device: Option = default(_DEFAULTS["device"])
    # Seconds between two GPU telemetry readings
    monitor_interval: Option & float = default(_DEFAULTS["monitor_interval"])
    # Disable the rate logger's windows and the GPU monitor (for overhead checks)
    no_instrument: Option & bool = default(_DEFAULTS["no_instrument"])
    # Write a torch.profiler Chrome trace of a few steady-state steps into this folder (relative: inside the results folder); those samples leave the steady state
    profile_trace: Option = default(_DEFAULTS["profile_trace"])
    # Steps that --profile-trace records (1 to 1000)
    profile_steps: Option & int = default(_DEFAULTS["profile_steps"])
    return {
        "max_count": max_count,
        "min_steady": min_steady,
        "sample_duration": sample_duration,
        "warmup": warmup,
        "seed": seed,
        "device": device,
        "monitor_interval": monitor_interval,
        "no_instrument": no_instrument,
        "profile_trace": profile_trace,
        "profile_steps": profile_steps,
    }
