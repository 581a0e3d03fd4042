"""Benchmark suite of torch_lwlrap: speed and memory against reference implementations and the hardware floor.

Run ``python -m benchmarks --help``; ``benchmarks/README.md`` explains the cases, the anchors and the output.
"""
