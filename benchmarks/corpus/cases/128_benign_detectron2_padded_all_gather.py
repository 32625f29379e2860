"""detectron2 comm.all_gather/gather: pickle, all_gather the sizes, pad to the max, gather, unpad; correct."""

EXPECT = {
    "source": "https://github.com/facebookresearch/detectron2/blob/60d7a1fd33cc48e58968659cd3301f3300b2786b/detectron2/utils/comm.py",  # noqa: E501
    "summary": "detectron2's comm.all_gather and comm.gather pickle arbitrary data into a uint8 tensor, "
    "all_gather every rank's byte count (_pad_to_largest_tensor), pad to the largest, then all_gather "
    "(or gather to dst, where only dst allocates the receive list) and cut each buffer back to its "
    "size. Evaluators use it to collect a different number of predictions per rank; the tensors that "
    "meet in each collective always have equal shapes.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import pickle
import time

import numpy as np
import torch
import torch.distributed as dist


def serialize_to_tensor(data):
    return torch.frombuffer(bytearray(pickle.dumps(data)), dtype=torch.uint8)


def pad_to_largest_tensor(tensor):
    world = dist.get_world_size()
    local_size = torch.tensor([tensor.numel()], dtype=torch.int64)
    size_list = [torch.zeros([1], dtype=torch.int64) for _ in range(world)]
    dist.all_gather(size_list, local_size)
    size_list = [int(s.item()) for s in size_list]
    max_size = max(size_list)
    if local_size.item() != max_size:
        tensor = torch.cat((tensor, torch.zeros(max_size - local_size.item(), dtype=torch.uint8)))
    return size_list, tensor


def all_gather(data):
    tensor = serialize_to_tensor(data)
    size_list, tensor = pad_to_largest_tensor(tensor)
    tensor_list = [torch.empty((max(size_list),), dtype=torch.uint8) for _ in size_list]
    dist.all_gather(tensor_list, tensor)
    return [pickle.loads(t.numpy().tobytes()[:size]) for size, t in zip(size_list, tensor_list)]


def gather(data, dst=0):
    tensor = serialize_to_tensor(data)
    size_list, tensor = pad_to_largest_tensor(tensor)
    if dist.get_rank() == dst:
        tensor_list = [torch.empty((max(size_list),), dtype=torch.uint8) for _ in size_list]
        dist.gather(tensor, tensor_list, dst=dst)
        return [pickle.loads(t.numpy().tobytes()[:size]) for size, t in zip(size_list, tensor_list)]
    dist.gather(tensor, [], dst=dst)
    return []


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    np.random.seed(rank)
    shared_seed = all_gather(int(np.random.randint(2**31)))[0]  # comm.shared_random_seed
    torch.manual_seed(rank)
    predictions = []
    for image_id in range(rank * 10, rank * 10 + 3 + 4 * rank):  # a different number of images per rank
        n_boxes = int(torch.randint(1, 5, ()).item())
        predictions.append({"image_id": image_id, "scores": [round(s, 4) for s in torch.rand(n_boxes).tolist()]})
    counts = all_gather(len(predictions))
    all_predictions = gather(predictions, dst=0)
    if rank == 0:
        merged = [p for per_rank in all_predictions for p in per_rank]
        mean_score = sum(sum(p["scores"]) for p in merged) / sum(len(p["scores"]) for p in merged)
        print(f"[rank{rank}] seed {shared_seed} counts {counts} images {len(merged)} mean {mean_score:.4f}", flush=True)
    else:
        print(f"[rank{rank}] seed {shared_seed} counts {counts}", flush=True)
    dist.destroy_process_group()
    time.sleep(0.2)  # let gloo's worker threads free their last Work before the interpreter exits


if __name__ == "__main__":
    main()
