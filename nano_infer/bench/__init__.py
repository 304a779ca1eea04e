"""Workloads and side-by-side benchmarks: nano_infer against transformers on the same weights.

`python -m nano_infer.bench` runs the comparison (see `__main__`); the pieces are here
for notebooks and tests: a workload (`workload`), one runner per engine (`throughput`),
the alternating rounds and medians (`compare`), the matmul roofline (`roofline`), the
models a --model value names and their workload sizes (`presets`);
`prefix` holds the prefix-cache TTFT benchmarks of chapters 03-04, `tp` the tensor-parallel measurements of
chapter 10; `quiet_profile` is torch.profiler without its start/stop lines on stderr.
"""
