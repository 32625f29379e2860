"""accelerate gather_object / broadcast_object_list: per-rank dicts of different sizes, a rank-0 config; correct."""

EXPECT = {
    "source": "https://github.com/huggingface/accelerate/blob/6a0677cc2778d9e807f97e386a29eab0522d1731/src/accelerate/utils/operations.py",  # noqa: E501
    "summary": "accelerate.utils.gather_object wraps torch.distributed.all_gather_object (then flattens the "
    "per-rank lists) and broadcast_object_list wraps torch's broadcast_object_list from the main "
    "process. A correct program: rank 0 broadcasts its run config, every rank all-gathers a list of "
    "per-sample records whose length differs per rank, and the per-rank summaries are gathered to "
    "rank 0 with gather_object; object collectives pad the pickles, so the sizes may differ.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import time

import torch
import torch.distributed as dist


def gather_object(obj):
    """accelerate.utils.gather_object on the multi-process path."""
    output = [None for _ in range(dist.get_world_size())]
    dist.all_gather_object(output, obj)
    return [x for y in output for x in y]


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    config = [{"lr": 0.01, "labels": ["cat", "dog", "bird"], "threshold": 0.5} if rank == 0 else None]
    dist.broadcast_object_list(config, src=0)  # accelerate.utils.broadcast_object_list(from_process=0)
    config = config[0]
    torch.manual_seed(rank)
    records = []
    for i in range(2 + 3 * rank):  # a different number of samples per rank
        probs = torch.rand(len(config["labels"]))
        records.append(
            {
                "id": f"r{rank}-{i}",
                "label": config["labels"][int(probs.argmax())],
                "score": round(probs.max().item(), 4),
            }
        )
    everything = gather_object(records)
    summary = {"rank": rank, "n": len(records), "kept": sum(r["score"] > config["threshold"] for r in records)}
    summaries = [None] * world if rank == 0 else None
    dist.gather_object(summary, summaries, dst=0)
    labels = sorted({r["label"] for r in everything})
    print(f"[rank{rank}] gathered {len(everything)} records labels {labels}", flush=True)
    if rank == 0:
        print(f"[rank{rank}] summaries {summaries}", flush=True)
    dist.destroy_process_group()
    time.sleep(0.2)  # let gloo's worker threads free their last Work before the interpreter exits


if __name__ == "__main__":
    main()
