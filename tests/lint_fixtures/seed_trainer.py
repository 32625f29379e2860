"""The seed stall, reconstructed: rank 0 validates through the DDP wrapper and every rank hangs at the barrier."""

import torch
import torch.distributed
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm


class Trainer:
    def __init__(self, model, train_loader, val_loader, local_rank, epochs=10):
        self.local_rank = local_rank
        self.encoder = DistributedDataParallel(model.cuda(local_rank), device_ids=[local_rank])
        self.train_loader = train_loader
        self.val_loader = val_loader
        self.epochs = epochs
        self.optimizer = torch.optim.SGD(self.encoder.parameters(), lr=0.1)
        self.CELoss = torch.nn.CrossEntropyLoss()

    def train(self):
        for epoch in range(self.epochs):  # epoch loop
            self.encoder.train()
            for _, data in enumerate(self.train_loader):  # iteration loop
                input = data[0].cuda()
                gt = data[1].cuda()
                output = self.encoder(input)
                loss = self.CELoss(output, gt)
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
                torch.distributed.barrier()  # multi-gpu sync (1)

            if torch.distributed.get_rank() == 0:
                self.encoder.eval()
                acc1, acc5, loss = self.validation()
                print(f"epoch {epoch}: acc1={acc1:.3f} acc5={acc5:.3f} loss={loss:.4f}")
                torch.save(self.encoder.module.state_dict(), f"checkpoint_{epoch}.pt")
            torch.distributed.barrier()  # multi-gpu sync (2)

    def validation(self):
        acc1 = 0.0
        acc5 = 0.0
        losses = []
        with torch.no_grad():
            for _, data in enumerate(tqdm(self.val_loader)):
                input = data[0].cuda()
                gt = data[1].cuda()

                outputs = self.encoder(input)  # expect: DDP001
                loss = self.CELoss(outputs, gt)

                losses.append(loss)
                acc1_, acc5_ = self.accuracy(outputs, gt, topk=(1, 5))
                acc1 += acc1_
                acc5 += acc5_

        acc1 = acc1 / len(self.val_loader)
        acc5 = acc5 / len(self.val_loader)
        loss = sum(losses) / len(losses)

        return acc1, acc5, loss

    @staticmethod
    def accuracy(output, target, topk=(1,)):
        maxk = max(topk)
        _, pred = output.topk(maxk, 1, True, True)
        correct = pred.t().eq(target.view(1, -1).expand_as(pred.t()))
        return [correct[:k].reshape(-1).float().sum().item() / target.size(0) for k in topk]
