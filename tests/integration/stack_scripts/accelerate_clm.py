"""A tiny GPT-2 trained by a loop in the shape of Hugging Face's ``run_clm_no_trainer.py``
(``Accelerator(gradient_accumulation_steps=...)``, a linear schedule, ``accelerator.accumulate``,
``accelerator.prepare(model, optimizer, dataloader, scheduler)``, a shuffled DataLoader), adopted
with ``AccelerateLoop``: the lines marked ``# cycler`` are the whole adoption.

Usage: accelerate_clm.py --out DIR [--accumulation N] [--mixed-precision bf16] [--every-steps N]
[--hostile NAME]. Rank 0 writes DIR/final.pt at the end of training; rank 0 prints "step S" after
each optimizer step. ``--hostile`` makes one of the mistakes the integration must refuse.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, Dataset, IterableDataset
from transformers import GPT2Config, GPT2LMHeadModel, get_linear_schedule_with_warmup

from cycler.integrations.accelerate import AccelerateLoop  # cycler

SEQUENCE, VOCAB = 16, 64


class Tokens(Dataset):
    def __init__(self, samples: int) -> None:
        generator = torch.Generator().manual_seed(7)
        self.tokens = torch.randint(0, VOCAB, (samples, SEQUENCE), generator=generator)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


class StreamedTokens(IterableDataset):
    def __init__(self, samples: int) -> None:
        self.tokens = Tokens(samples)

    def __iter__(self):
        return (self.tokens[index] for index in range(len(self.tokens)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=160)
    parser.add_argument("--accumulation", type=int, default=2)
    parser.add_argument("--mixed-precision", default="no")
    parser.add_argument("--every-steps", type=int, default=None)
    parser.add_argument("--delay", type=float, default=0.05)
    parser.add_argument("--hostile", default=None,
                        choices=["no-accumulate", "user-skip", "iterable", "user-save-state"])
    args = parser.parse_args()
    accelerator = Accelerator(gradient_accumulation_steps=args.accumulation,
                              mixed_precision=args.mixed_precision, cpu=True)
    set_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQUENCE, n_embd=32, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config)  # dropout on: exact resume needs every process's RNG
    data = StreamedTokens(args.samples) if args.hostile == "iterable" else Tokens(args.samples)
    train_dataloader = DataLoader(data, shuffle=args.hostile != "iterable", batch_size=2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    steps_per_epoch = len(Tokens(args.samples)) // 2 // accelerator.num_processes \
        // args.accumulation
    lr_scheduler = get_linear_schedule_with_warmup(optimizer, 5, steps_per_epoch * args.epochs)
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, lr_scheduler)
    loop = AccelerateLoop(accelerator, every_steps=args.every_steps)  # cycler
    starting_epoch, completed_steps = loop.resume()  # cycler

    for epoch in range(starting_epoch, args.epochs):
        model.train()
        active_dataloader = train_dataloader
        if args.hostile == "user-skip":
            active_dataloader = accelerator.skip_first_batches(train_dataloader, 1)
        for batch in loop.batches(active_dataloader, epoch):  # cycler
            if args.hostile == "no-accumulate":
                loss = model(**batch).loss / args.accumulation
                accelerator.backward(loss)
            else:
                with accelerator.accumulate(model):
                    outputs = model(**batch)
                    accelerator.backward(outputs.loss)
                    optimizer.step()
                    lr_scheduler.step()
                    optimizer.zero_grad()
            if accelerator.sync_gradients:
                completed_steps += 1
                time.sleep(args.delay)
                if accelerator.is_main_process:
                    print(f"step {completed_steps}", flush=True)
                if args.hostile == "user-save-state" and completed_steps % 7 == 0:
                    accelerator.save_state(str(args.out / f"step_{completed_steps}"))
            loop.step()  # cycler

    loop.close()  # cycler
    if accelerator.is_main_process:
        weights = accelerator.unwrap_model(model).state_dict()
        torch.save({k: v.clone() for k, v in weights.items()}, args.out / "final.pt")
        print(f"training finished {os.environ.get('RANK', '0')}", flush=True)


if __name__ == "__main__":
    main()
