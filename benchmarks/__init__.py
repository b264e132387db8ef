"""darkpy's benchmark suite: darkpy against the same network in PyTorch CPU and ONNX Runtime, run by hand.

`python -m benchmarks.run` times every network of the suite; `python -m benchmarks.run --layers CFG`
prints a per-layer table. See benchmarks/README.md. Nothing here is imported by darkpy or its tests,
except `torch_model` by tests/test_bench_translator.py (skipped without torch).
"""
