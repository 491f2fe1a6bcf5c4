"""A typical hand-written GPT training loop in the style of nanoGPT's train.py: DDP, AdamW, a
GradScaler, random batches drawn from a token array, a prefetched batch, an evaluation every
``eval_interval`` iterations; adopted with :class:`cycler.integrations.loop.LoopState`.

    cycle run --nproc-per-node 2 examples/nanogpt_style.py --out-dir out

Stop it at any moment: it checkpoints at a step every rank agrees on and exits; the same command
continues from there, bit-identical to a run never stopped (docs/integrations.md shows the diff
against the loop before adoption).
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from cycler import settle_ddp_buckets
from cycler.integrations.loop import LoopState


class GPT(nn.Module):
    def __init__(self, vocab: int, block_size: int, n_embd: int, n_layer: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, n_embd)
        self.pos = nn.Embedding(block_size, n_embd)
        layer = nn.TransformerEncoderLayer(n_embd, 2, 4 * n_embd, dropout=0.1, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, n_layer)
        self.head = nn.Linear(n_embd, vocab)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, ...]:
        positions = torch.arange(idx.size(1), device=idx.device)
        mask = nn.Transformer.generate_square_subsequent_mask(idx.size(1), device=idx.device)
        x = self.blocks(self.tok(idx) + self.pos(positions), mask=mask, is_causal=True)
        logits = self.head(x)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out-dir", type=Path, default=Path("out"))
    parser.add_argument("--max-iters", type=int, default=120)
    parser.add_argument("--eval-interval", type=int, default=25)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--delay", type=float, default=0.0, help="extra seconds per iteration")
    args = parser.parse_args()

    ddp = int(os.environ.get("RANK", -1)) != -1
    if ddp:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if ddp else 0
    master_process = rank == 0
    torch.manual_seed(1337 + rank)
    data = torch.randint(0, 128, (20000,), generator=torch.Generator().manual_seed(0))
    train_data, val_data = data[:18000], data[18000:]

    def get_batch(split: str) -> tuple[torch.Tensor, torch.Tensor]:
        source = train_data if split == "train" else val_data
        ix = torch.randint(len(source) - args.block_size, (args.batch_size,))
        x = torch.stack([source[i:i + args.block_size] for i in ix])
        y = torch.stack([source[i + 1:i + 1 + args.block_size] for i in ix])
        return x, y

    torch.manual_seed(1337)  # the same initial weights on every rank
    model = GPT(128, args.block_size, 32, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    always_save_checkpoint = True
    loop = LoopState(model=model, optimizer=optimizer, scaler=scaler,
                     every_steps=args.eval_interval)
    torch.manual_seed(1337 + rank)  # each rank's own batches
    raw_model = model
    if ddp:
        model = DDP(model)
        # Its first step all-reduces in the layout of every later one, so that a resumed step
        # sums as the uninterrupted run's did (docs/saving.md, "DDP at three ranks or more").
        settle_ddp_buckets(model)
    iter_num, best_val_loss, batch = loop.resume(iter_num=0, best_val_loss=1e9, batch=None)

    @torch.no_grad()
    def estimate_loss() -> float:
        model.eval()
        losses = torch.stack([raw_model(*get_batch("val"))[1] for _ in range(4)])
        model.train()
        return losses.mean().item()

    def get_lr(it: int) -> float:
        return 1e-3 * 0.5 * (1 + math.cos(math.pi * min(it, args.max_iters) / args.max_iters))

    X, Y = batch or get_batch("train")  # fetch the very first batch
    while True:
        for group in optimizer.param_groups:
            group["lr"] = get_lr(iter_num)
        if iter_num % args.eval_interval == 0 and master_process:
            val_loss = estimate_loss()
            print(f"iter {iter_num}: val loss {val_loss:.4f}", flush=True)
            if val_loss < best_val_loss or always_save_checkpoint:
                best_val_loss = val_loss
        _, loss = model(X, Y)
        X, Y = get_batch("train")  # prefetch the next batch while the GPU works
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        time.sleep(args.delay)
        iter_num += 1
        print(f"step {iter_num}", flush=True)
        if loop.step(iter_num=iter_num, best_val_loss=best_val_loss, batch=(X, Y)):
            break
        if iter_num >= args.max_iters:
            break

    loop.close()
    if master_process and not loop.stopped:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        torch.save(raw_model.state_dict(), args.out_dir / "final.pt")
        print("training finished", flush=True)
    if ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
