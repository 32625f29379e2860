"""The jobs benchmarks/whole_job.py launches, as a user would: `torchrun ... whole_job_train.py JOB STEPS`.

Nothing here imports ddpwatch: under DDPWATCH=1 the start-up hook guards the ranks, as it would any script. Each
rank writes what it measured (its training loop's wall and CPU time, that CPU time by thread) to
$BENCH_WHOLEJOB_OUT/rank<R>.json, and, only when ddpwatch is armed, what ddpwatch had on (a check that the run was
what its label says).

The jobs (STEPS: micro-steps per rank):
- ddp: a small ResNet with BatchNorm under DistributedDataParallel, gradients accumulated over 2 micro-steps with
  no_sync, the loss all_reduced every micro-step, a barrier every 5, a DistributedSampler; each epoch of 100
  micro-steps ends with a sharded validation (its counts all_reduced), a checkpoint on rank 0 and a barrier; a tqdm
  bar on rank 0.
- fsdp2: a small transformer-style MLP (pre-norm residual blocks) sharded with torch.distributed.fsdp.fully_shard
  per block and at the root, AdamW, the loss all_reduced every step.
- many: a small MLP without a wrapper, its gradients all_reduced one tensor at a time, then 100 one-element
  metric all_reduces per step and a broadcast every 10 steps: many small collectives from Python.

BENCH_WHOLEJOB_LEVEL (set by the benchmark's attribution, only with DDPWATCH=1) switches parts of ddpwatch off
before the process group starts: benchmarks/whole_job_parts.py.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import resource
import sys
import time

EPOCH = 100  # micro-steps per epoch of the ddp job
ACCUMULATE = 2
BATCH = 16
METRICS = 100  # one-element all_reduces per step of the many job


def ddp_job(steps: int, rank: int, world: int, out: str):
    """Returns the loop: a function running the job's training, called between two barriers."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler
    from tqdm import tqdm

    torch.manual_seed(0)
    model = DistributedDataParallel(small_resnet())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    epoch_steps = min(steps, EPOCH)
    train = synthetic(epoch_steps * BATCH * world, seed=1)
    val = synthetic(10 * BATCH * world, seed=2)
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True)
    loader = DataLoader(train, batch_size=BATCH, sampler=sampler)
    val_loader = DataLoader(val, batch_size=BATCH, sampler=DistributedSampler(val, world, rank, shuffle=False))

    def validate():
        model.eval()
        counts = torch.zeros(2)
        with torch.no_grad():
            for inputs, labels in val_loader:
                counts += torch.tensor([(model(inputs).argmax(1) == labels).sum().item(), len(labels)])
        dist.all_reduce(counts)
        model.train()

    def loop():
        bar = tqdm(total=steps, disable=rank != 0, file=sys.stderr, mininterval=0.5)
        done, epoch = 0, 0
        while done < steps:
            sampler.set_epoch(epoch)
            for inputs, labels in loader:
                synced = (done + 1) % ACCUMULATE == 0
                with contextlib.nullcontext() if synced else model.no_sync():
                    loss = loss_fn(model(inputs), labels) / ACCUMULATE
                    loss.backward()
                if synced:
                    optimizer.step()
                    optimizer.zero_grad()
                metric = loss.detach().clone()
                dist.all_reduce(metric)
                done += 1
                if done % 5 == 0:
                    dist.barrier()
                bar.update(1)
                bar.set_postfix(loss=f"{metric.item():.3f}", refresh=False)
                if done >= steps:
                    break
            validate()
            if rank == 0:
                torch.save(
                    {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()},
                    os.path.join(out, "checkpoint.pt"),
                )
            dist.barrier()
            epoch += 1
        bar.close()

    return loop


def small_resnet():
    """Conv stem, two residual blocks with BatchNorm (one downsampling), pooled into a linear head."""
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self, inp: int, out: int, stride: int):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(inp, out, 3, stride, 1, bias=False),
                nn.BatchNorm2d(out),
                nn.ReLU(),
                nn.Conv2d(out, out, 3, 1, 1, bias=False),
                nn.BatchNorm2d(out),
            )
            self.skip = (
                nn.Identity()
                if stride == 1 and inp == out
                else nn.Sequential(nn.Conv2d(inp, out, 1, stride, bias=False), nn.BatchNorm2d(out))
            )
            self.relu = nn.ReLU()

        def forward(self, x):
            return self.relu(self.body(x) + self.skip(x))

    return nn.Sequential(
        nn.Conv2d(3, 16, 3, 1, 1, bias=False),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        Block(16, 16, 1),
        Block(16, 32, 2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )


def synthetic(size: int, seed: int):
    import torch
    from torch.utils.data import TensorDataset

    generator = torch.Generator().manual_seed(seed)
    return TensorDataset(
        torch.randn(size, 3, 32, 32, generator=generator), torch.randint(0, 10, (size,), generator=generator)
    )


def fsdp2_job(steps: int, rank: int, world: int, out: str):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.fsdp import fully_shard

    class Block(nn.Module):
        def __init__(self, dim: int):
            super().__init__()
            self.norm = nn.LayerNorm(dim)
            self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

        def forward(self, x):
            return x + self.mlp(self.norm(x))

    torch.manual_seed(0)
    dim = 128
    model = nn.Sequential(nn.Linear(32, dim), *[Block(dim) for _ in range(4)], nn.LayerNorm(dim), nn.Linear(dim, 10))
    for block in model[1:5]:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(rank)
    inputs, labels = torch.randn(32, 32, generator=generator), torch.randint(0, 10, (32,), generator=generator)

    def loop():
        for _ in range(steps):
            loss = nn.functional.cross_entropy(model(inputs), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            metric = loss.detach().clone()
            dist.all_reduce(metric)

    return loop


def many_job(steps: int, rank: int, world: int, out: str):
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(rank)
    inputs, labels = torch.randn(32, 32, generator=generator), torch.randint(0, 10, (32,), generator=generator)
    metrics = [torch.zeros(1) for _ in range(METRICS)]

    def loop():
        for step in range(steps):
            loss = nn.functional.cross_entropy(model(inputs), labels)
            loss.backward()
            for param in model.parameters():
                dist.all_reduce(param.grad)
                param.grad /= world
            optimizer.step()
            optimizer.zero_grad()
            value = loss.item()
            for index, metric in enumerate(metrics):
                metric.fill_(value * index)
                dist.all_reduce(metric)
            if step % 10 == 0:
                dist.broadcast(metrics[0], 0)

    return loop


JOBS = {"ddp": ddp_job, "fsdp2": fsdp2_job, "many": many_job}


def threads_cpu() -> dict | None:
    """This process's CPU seconds so far by thread kind: "training" (the main thread, the training loop's), "ddpwatch"
    (Python threads named ddpwatch-*) and "backend" (every other thread: gloo's and torch's own, unnamed in Python);
    None where /proc cannot be read (not Linux). A thread that ended is no longer counted."""
    import threading

    main = threading.main_thread().native_id
    ours = {t.native_id for t in threading.enumerate() if t.name.startswith("ddpwatch")}
    tick, kinds = os.sysconf("SC_CLK_TCK"), {"training": 0.0, "ddpwatch": 0.0, "backend": 0.0}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()  # the name, in parentheses, may hold spaces
        except OSError:
            continue  # ended meanwhile
        kind = "training" if int(tid) == main else "ddpwatch" if int(tid) in ours else "backend"
        kinds[kind] += (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return kinds


def armed_facts() -> dict | None:
    """What ddpwatch had on in this rank (None: not loaded, the plain runs): a check on the run's label."""
    session_module = sys.modules.get("ddpwatch.session")
    session = session_module.current() if session_module is not None else None
    if session is None:
        return None
    watchdog = session.watchdog
    return {
        "patches": len(session.patcher.patches.made()),
        "records": session.recorder.progress,
        "watchdog": watchdog is not None and watchdog.is_alive(),
        "heartbeats": watchdog.states.beat if watchdog is not None else 0,
        "file": os.path.dirname(os.path.dirname(sys.modules["ddpwatch"].__file__)),
    }


def main() -> None:
    job, steps = sys.argv[1], int(sys.argv[2])
    level = os.environ.get("BENCH_WHOLEJOB_LEVEL")
    if level and os.environ.get("DDPWATCH"):
        from benchmarks import whole_job_parts  # the checkout is on PYTHONPATH (benchmarks/_common.child_env)

        whole_job_parts.switch_off_above(int(level))
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world, out = dist.get_rank(), dist.get_world_size(), os.environ["BENCH_WHOLEJOB_OUT"]
    loop = JOBS[job](steps, rank, world, out)
    dist.barrier()
    threads, wall, cpu = threads_cpu(), time.perf_counter(), time.process_time()
    loop()
    dist.barrier()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    after = threads_cpu()
    by_thread = {kind: after[kind] - threads[kind] for kind in after} if threads and after else None
    facts = armed_facts()  # before destroy: the watchdog is stopped there
    dist.destroy_process_group()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as handle:
        json.dump(
            {
                "rank": rank,
                "job": job,
                "steps": steps,
                "loop_wall_s": wall,
                "loop_cpu_s": cpu,
                "loop_cpu_by_thread_s": by_thread,
                "process_cpu_s": usage.ru_utime + usage.ru_stime,
                "ddpwatch": facts,
                "level": int(level) if level else None,
            },
            handle,
        )


if __name__ == "__main__":
    main()
