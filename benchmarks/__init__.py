"""ddpwatch's benchmarks: overhead, time to verdict, scale, memory; `python -m benchmarks [--quick]` runs them all."""
