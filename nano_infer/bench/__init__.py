"""Workloads and side-by-side benchmarks."""
