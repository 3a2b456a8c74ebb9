"""Reproducible speed and memory benchmarks of orderflow: the embedded broker, the devhost Durable
backend, the
whole local pipeline and the idle cost of a running devhost. Run with `python -m benchmarks` (see README.md).
"""
