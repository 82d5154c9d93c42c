"""Benchmark programs. Each module defines ``main(experiment, argv)``."""
