"""Real hangs written with Lightning, Accelerate, FSDP2, DTensor and functional collectives: `frameworks.py CASE`.

Run on N ranks with the torchrun-like environment of tests/ranks.py (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_*):
Lightning sees LOCAL_RANK (an externally launched DDP job), Accelerate LOCAL_RANK/WORLD_SIZE (MULTI_CPU, gloo).
ddpwatch is on as users turn it on: `with ddpwatch.guard():` around the case, or zero-code when DDPWATCH is set.
User lines are tagged `# LINE:tag`; `DDPWATCH-MARK hang-forms` is printed just before the hang forms.
"""

import os
import sys
import tempfile
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

import ddpwatch

FSDP_STEPS = int(os.environ.get("FRAMEWORKS_STEPS", "3"))  # fsdp2_benign: 200 checks in-flight growth
EPOCHS = 2


def mark_hang_forms():
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


def random_batches(samples=16, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(samples, 4, generator=generator), torch.randn(samples, 1, generator=generator))


# ---------------------------------------------------------------- Lightning

def lightning_regression():
    """A LightningModule base class (made on demand: the other cases must not need lightning installed)."""
    import lightning as L

    class Regression(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(4, 1)

        def loss(self, batch):
            x, y = batch
            return nn.functional.mse_loss(self.layer(x), y)

        def training_step(self, batch, batch_idx):
            loss = self.loss(batch)
            self.log("train_loss", loss, sync_dist=True)  # on every rank: Lightning reduces it at once (on_step)
            return loss

        def validation_step(self, batch, batch_idx):
            self.loss(batch)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self):
            return DataLoader(random_batches(), batch_size=4)

        def val_dataloader(self):
            return DataLoader(random_batches(8, seed=1), batch_size=4)

    return Regression


def lightning_fit(module, callbacks=(), checkpointing=False):
    import lightning as L

    warnings.filterwarnings("ignore")  # Lightning's advice on num_workers and the like, on every rank
    root = os.environ.get("FRAMEWORKS_ROOT_DIR") or tempfile.mkdtemp(prefix="ddpwatch-fw-")
    # No checkpointing in the hangs: ModelCheckpoint's own reduce would meet the stray one and gloo would abort.
    trainer = L.Trainer(accelerator="cpu", devices=int(os.environ["WORLD_SIZE"]), strategy="ddp",
                        max_epochs=EPOCHS, logger=False, enable_checkpointing=checkpointing,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        default_root_dir=root, callbacks=list(callbacks))
    trainer.fit(module)


def lightning_log_sync_rank0():
    class LogOnZero(lightning_regression()):
        def validation_step(self, batch, batch_idx):
            loss = self.loss(batch)
            if self.trainer.is_global_zero:
                mark_hang_forms()
                self.log("val_x", loss, sync_dist=True)  # LINE:log_sync

    lightning_fit(LogOnZero())


def lightning_barrier_rank0():
    import lightning as L

    class SaveOnZero(L.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            if trainer.is_global_zero:
                mark_hang_forms()
                trainer.strategy.barrier()  # LINE:strategy_barrier

    lightning_fit(lightning_regression()(), callbacks=[SaveOnZero()])


def lightning_rank_zero_only():
    from lightning.pytorch.utilities import rank_zero_only

    class ShareBest(lightning_regression()):
        def on_train_epoch_end(self):
            self.share_best_score(0.5)  # LINE:rank_zero_call

        @rank_zero_only
        def share_best_score(self, score):
            mark_hang_forms()
            return self.trainer.strategy.broadcast(score)  # LINE:rank_zero_broadcast

    lightning_fit(ShareBest())


def lightning_fit_benign():
    class LogEverywhere(lightning_regression()):
        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self.loss(batch), sync_dist=True)

    lightning_fit(LogEverywhere(), checkpointing=True)


# ---------------------------------------------------------------- Accelerate

def accelerate_setup():
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(random_batches(), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    return accelerator, model, optimizer, loader


def accelerate_train_epoch(accelerator, model, optimizer, loader):
    outputs = []
    for x, y in loader:
        prediction = model(x)
        loss = nn.functional.mse_loss(prediction, y)
        optimizer.zero_grad()
        accelerator.backward(loss)
        optimizer.step()
        outputs.append(prediction.detach())
    return torch.cat(outputs)


def accelerate_wait_rank0():
    accelerator, model, optimizer, loader = accelerate_setup()
    for epoch in range(EPOCHS):
        accelerate_train_epoch(accelerator, model, optimizer, loader)
        if accelerator.is_main_process:
            mark_hang_forms()
            accelerator.wait_for_everyone()  # LINE:wait_for_everyone


def accelerate_gather_rank0():
    accelerator, model, optimizer, loader = accelerate_setup()
    for epoch in range(EPOCHS):
        predictions = accelerate_train_epoch(accelerator, model, optimizer, loader)
        if accelerator.is_main_process:
            mark_hang_forms()
            everything = accelerator.gather(predictions)  # LINE:gather
            print(f"epoch {epoch}: {everything.shape[0]} predictions", file=sys.stderr)


def accelerate_on_main_process():
    accelerator, model, optimizer, loader = accelerate_setup()

    @accelerator.on_main_process
    def log_mean_prediction(predictions):
        mark_hang_forms()
        mean = accelerator.reduce(predictions.mean(), reduction="mean")  # LINE:on_main_reduce
        print(f"mean prediction {mean.item():.3f}", file=sys.stderr)

    for epoch in range(EPOCHS):
        predictions = accelerate_train_epoch(accelerator, model, optimizer, loader)
        log_mean_prediction(predictions)  # LINE:on_main_call
        accelerator.wait_for_everyone()  # LINE:on_main_wait


def accelerate_benign():
    accelerator, model, optimizer, loader = accelerate_setup()
    for epoch in range(EPOCHS):
        accelerate_train_epoch(accelerator, model, optimizer, loader)
        model.eval()
        with torch.no_grad():
            for x, y in loader:
                predictions, targets = accelerator.gather_for_metrics((model(x), y))
        model.train()
        accelerator.wait_for_everyone()
    accelerator.end_training()


# ---------------------------------------------------------------- FSDP2 (fully_shard)

def fsdp2_model():
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    return model


def fsdp2_train(model, steps):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        x, y = torch.randn(4, 4), torch.randn(4, 1)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def fsdp2_evaluate(model):
    with torch.no_grad():
        return model(torch.randn(4, 4)).mean()  # LINE:fsdp_eval_forward


def fsdp2_eval_rank0():
    dist.init_process_group("gloo")
    model = fsdp2_model()
    fsdp2_train(model, steps=2)
    if dist.get_rank() == 0:
        mark_hang_forms()
        print(f"eval {fsdp2_evaluate(model).item():.3f}", file=sys.stderr)  # LINE:fsdp_eval_call
    dist.barrier()  # LINE:fsdp_barrier
    dist.destroy_process_group()


def fsdp2_benign():
    dist.init_process_group("gloo")
    model = fsdp2_model()
    for epoch in range(EPOCHS):
        fsdp2_train(model, steps=FSDP_STEPS)
        fsdp2_evaluate(model)
        dist.barrier()
    print_records_in_flight()
    dist.destroy_process_group()


def print_records_in_flight():
    """Every collective has returned (the barrier above did): a correct recorder holds nothing in flight now."""
    from ddpwatch.session import current

    session = current()
    count = len(session.recorder.inflight) if session is not None else -1
    print(f"FRAMEWORKS-INFLIGHT {count}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- functional collectives and DTensor

def funcol_rank0():
    import torch.distributed._functional_collectives as funcol

    dist.init_process_group("gloo")
    dist.barrier()
    if dist.get_rank() == 0:
        mark_hang_forms()
        total = funcol.all_reduce(torch.ones(4), "sum", dist.group.WORLD)  # LINE:funcol_all_reduce
        print(f"total {total.sum().item()}", file=sys.stderr)  # LINE:funcol_use
    dist.barrier()  # LINE:funcol_barrier
    dist.destroy_process_group()


def ops_rank0():
    """The op itself, `torch.ops._c10d_functional` (what compiled graphs call): Python's patches never see it."""
    dist.init_process_group("gloo")
    dist.barrier()
    if dist.get_rank() == 0:
        mark_hang_forms()
        issued = torch.ops._c10d_functional.all_reduce(torch.ones(4), "sum", "0")
        torch.ops._c10d_functional.wait_tensor(issued)  # LINE:ops_wait
    dist.barrier()  # LINE:ops_barrier
    dist.destroy_process_group()


def funcol_benign():
    import torch.distributed._functional_collectives as funcol

    dist.init_process_group("gloo")
    for _ in range(5):
        total = funcol.all_reduce(torch.ones(4), "sum", dist.group.WORLD)
        gathered = funcol.all_gather_single(torch.ones(2), 0, dist.group.WORLD)
        assert total.sum().item() == 4 * dist.get_world_size() and gathered.numel() == 2 * dist.get_world_size()
    dist.barrier()
    dist.destroy_process_group()


def sharded_dtensor():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    return distribute_tensor(torch.arange(16.0).reshape(4, 4), mesh, [Shard(0)])


def dtensor_rank0():
    dist.init_process_group("gloo")
    weights = sharded_dtensor()
    dist.barrier()
    if dist.get_rank() == 0:
        mark_hang_forms()
        full = weights.full_tensor()  # LINE:dtensor_full_tensor
        print(f"full {full.sum().item()}", file=sys.stderr)
    dist.barrier()  # LINE:dtensor_barrier
    dist.destroy_process_group()


def dtensor_benign():
    from torch.distributed.tensor import Replicate

    dist.init_process_group("gloo")
    weights = sharded_dtensor()
    for _ in range(3):
        full = weights.full_tensor()
        replicated = weights.redistribute(placements=[Replicate()]).to_local()
        assert torch.equal(full, replicated)
    dist.barrier()
    dist.destroy_process_group()


# ---------------------------------------------------------------- plain torch + DDP

def skip_after_checkpoint(model=None):
    """Both ranks train the same 3 steps and match the checkpoint barrier; rank 1 then skips the epoch-end barrier."""
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # BatchNorm: the rank that runs ahead blocks in the next forward's buffer broadcast, with equal step counts.
    model = DistributedDataParallel(model or nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
    for epoch in range(3):
        for _ in range(3):
            model(torch.randn(8, 4)).sum().backward()  # LINE:skip_ckpt_step
        dist.barrier()  # LINE:checkpoint_barrier
        if rank == 1 and epoch == 0:
            mark_hang_forms()
            continue  # LINE:skip_ckpt_continue
        dist.barrier()  # LINE:skip_ckpt_barrier
    dist.destroy_process_group()


def skip_after_checkpoint_backward():
    """The same skip with a buffer-less model: the rank that runs ahead blocks in backward's gradient all-reduce."""
    skip_after_checkpoint(nn.Linear(4, 4))


CASES = {case.__name__: case for case in (ops_rank0,
    lightning_log_sync_rank0, lightning_barrier_rank0, lightning_rank_zero_only, lightning_fit_benign,
    accelerate_wait_rank0, accelerate_gather_rank0, accelerate_on_main_process, accelerate_benign,
    fsdp2_eval_rank0, fsdp2_benign, funcol_rank0, funcol_benign, dtensor_rank0, dtensor_benign,
    skip_after_checkpoint, skip_after_checkpoint_backward)}


def main():
    case = CASES[sys.argv[1]]
    torch.set_num_threads(1)
    if os.environ.get("DDPWATCH"):
        case()  # zero-code activation: DDPWATCH=1 guarded this process from start-up
    else:
        with ddpwatch.guard():
            case()
    print("rank finished cleanly", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
