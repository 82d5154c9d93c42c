"""Device backends per GPU vendor (see :mod:`milarun.accel.base`). No torch."""
