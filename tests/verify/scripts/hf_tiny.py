"""A tiny GPT-2 trained by a Hugging Face Trainer, adopted with the documented one line
(``callbacks=[CyclerCallback()]``): what ``cycle verify`` must find IDENTICAL.

    cycle verify tests/verify/scripts/hf_tiny.py [--forget rng|optimizer] [--save-steps N]
                                                 [--step-seconds S]

It writes HF's own ``out/`` (output_dir: its logs) in its working directory and
``final.pt`` there at the end, as scripts do. ``--forget rng`` skips HF's restore of every
rank's RNG; ``--forget optimizer`` the optimizer's. ``--step-seconds`` (0.05) stands for a real
step's compute, a sleep after each step: without it the 48 steps take milliseconds each, and on a
fast machine a stop could land after the last one.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils.data import Dataset
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from cycler.integrations.transformers import CyclerCallback

SEQUENCE, VOCAB = 8, 32


class Tokens(Dataset):
    def __init__(self, samples: int) -> None:
        generator = torch.Generator().manual_seed(7)
        self.tokens = torch.randint(0, VOCAB, (samples, SEQUENCE), generator=generator)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


class Compute(TrainerCallback):
    """A sleep after each step, standing for a real step's compute."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.seconds)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--forget", choices=["rng", "optimizer"], default=None)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=96)
    parser.add_argument("--save-steps", type=int, default=500)
    parser.add_argument("--step-seconds", type=float, default=0.05)
    args = parser.parse_args()
    if args.forget == "rng":
        Trainer._load_rng_state = lambda self, checkpoint: None
    elif args.forget == "optimizer":
        Trainer._load_optimizer_and_scheduler = lambda self, checkpoint: None
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQUENCE, n_embd=16, n_layer=1, n_head=2)
    model = GPT2LMHeadModel(config)  # dropout on: an exact resume needs the RNG
    training = TrainingArguments(
        output_dir="out", num_train_epochs=args.epochs, per_device_train_batch_size=4,
        learning_rate=1e-3, save_steps=args.save_steps, logging_steps=5, seed=0,
        use_cpu=True, ddp_backend="gloo", report_to=[], disable_tqdm=True,
        dataloader_num_workers=0)
    trainer = Trainer(model=model, args=training, train_dataset=Tokens(args.samples),
                      callbacks=[CyclerCallback(), Compute(args.step_seconds)])
    trainer.train()
    if trainer.is_world_process_zero():
        torch.save(trainer.model.state_dict(), "final.pt")


if __name__ == "__main__":
    main()
