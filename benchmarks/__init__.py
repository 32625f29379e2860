"""ddpwatch's benchmarks: overhead, time to verdict, scale and memory; `python -m benchmarks [--quick]` runs them all."""
