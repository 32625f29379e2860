"""facebookresearch/vggt#285: batches capped by images per GPU give the ranks different numbers of batches per epoch."""

EXPECT = {
    "source": "https://github.com/facebookresearch/vggt/issues/285",
    "summary": "'Potential Deadlock in Multi-GPU Training with Dynamic Batch Sizes': with max_img_per_gpu=24 and "
               "image_num_range=[2,24] the number of images per batch varies, so GPU0 might finish its samples in "
               "20 batches while GPU1 needs 30, and at batch 21 GPU1 waits for GPU0 in the DDP all-reduce; "
               "limiting every GPU to the same number of batches avoids the freeze (distilled: a generator that "
               "packs each rank's scenes into batches of at most 24 images, plain DDP).",
    "family": "collective",
    "world_size": 2,
    "kind": "uneven_inputs",
    "ranks": [1],
    "line": "dynamic_backward",
    "fix": ["join", "drop_last", "same number", "limit_train_batches"],
}

import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

MAX_IMG_PER_GPU = 24
SCENES_PER_RANK = 12


def mark():
    # Printed before every collective-bearing step: the last one printed is where this rank blocks for good.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


def scenes(rank):
    # Every rank gets the same number of scenes, each with its own number of views (2 to 24 images).
    generator = torch.Generator().manual_seed(1000 + rank)
    counts = torch.randint(2, 25, (SCENES_PER_RANK,), generator=generator).tolist()
    return [torch.randn(n, 8, generator=generator) for n in counts]


def dynamic_batches(scene_list):
    batch, images = [], 0
    for scene in scene_list:
        if batch and images + scene.shape[0] > MAX_IMG_PER_GPU:
            yield batch
            batch, images = [], 0
        batch.append(scene)
        images += scene.shape[0]
    if batch:
        yield batch


class SceneModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(8, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, batch):
        return torch.stack([self.head(torch.relu(self.encoder(views)).mean(0)) for views in batch])


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(SceneModel())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    count = 0
    for batch in dynamic_batches(scenes(rank)):
        mark()
        prediction = model(batch)
        loss = prediction.pow(2).mean()
        optimizer.zero_grad()
        loss.backward()  # LINE:dynamic_backward
        optimizer.step()
        count += 1
    print(f"[rank{rank}] epoch done after {count} batches", file=sys.stderr, flush=True)
    mark()
    dist.barrier()  # end of epoch
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
