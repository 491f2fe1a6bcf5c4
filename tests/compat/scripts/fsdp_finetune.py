"""An FSDP fine-tune saved with torch.distributed.checkpoint, the cycling_utils way; only the
import line names cycler.

The idioms of the ISC LLM demo, written anew: a small token model sharded with FSDP2
(`fully_shard`), its model and optimizer state taken with torch's `get_state_dict` and written by
`dcp.save` from every rank into the directory `AtomicDirectory.prepare_checkpoint_directory()`
gave every rank; rank 0 adds the samplers with `torch.save`; every rank calls `symlink_latest`.
The step, the last batch and the save cadence are read from `len(train_dataloader)` at every
step. It installs no signal handler and never reads a control file.

    cycle run --nproc-per-node 2 fsdp_finetune.py --final-weights final.pt
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset

# from cycling_utils import AtomicDirectory, InterruptableDistributedSampler, TimestampedTimer
from cycler import AtomicDirectory, InterruptableDistributedSampler, TimestampedTimer

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--sequences", type=int, default=512)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--save-every", type=int, default=8)
parser.add_argument("--batch-delay", type=float, default=0.0)  # a heavier model, simulated
parser.add_argument("--final-weights", default=None)
args = parser.parse_args()

VOCAB, LENGTH, WIDTH = 64, 16, 32
timer = TimestampedTimer("Imported")
dist.init_process_group("gloo")
rank = dist.get_rank()


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(),
                          nn.Linear(2 * WIDTH, WIDTH)) for _ in range(2))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # Token by token (a 2-D batch): FSDP2 warns about modules that return 3-D views.
        hidden = self.embed(tokens.reshape(-1))
        for block in self.blocks:
            hidden = hidden + block(hidden)
        return self.head(hidden)


torch.manual_seed(0)
model = TinyLM()
for block in model.blocks:
    fully_shard(block)
fully_shard(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
tokens = torch.randint(0, VOCAB, (args.sequences, LENGTH + 1))
train_dataset = TensorDataset(tokens)
train_sampler = InterruptableDistributedSampler(train_dataset)
train_dataloader = DataLoader(train_dataset, batch_size=args.batch_size, sampler=train_sampler)
saver = AtomicDirectory(output_directory=os.environ["CHECKPOINT_ARTIFACT_PATH"],
                        is_master=rank == 0)
timer.report("Setup complete")

latest_symlink = os.path.join(saver.output_directory, saver.symlink_name)
if os.path.islink(latest_symlink):
    checkpoint_path = os.readlink(latest_symlink)
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=checkpoint_path)
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"])
    train_state = torch.load(os.path.join(checkpoint_path, "train_state.pt"), weights_only=True)
    train_sampler.load_state_dict(train_state["train_sampler"])
    timer.report(f"Resumed from {checkpoint_path}")

for epoch in range(train_sampler.epoch, args.epochs):
    train_sampler.set_epoch(epoch)
    for (batch,) in train_dataloader:
        step = train_sampler.progress // train_dataloader.batch_size
        is_last_step = (step + 1) == len(train_dataloader)
        is_save_step = ((step + 1) % args.save_every == 0) or is_last_step

        logits = model(batch[:, :-1])
        loss = nn.functional.cross_entropy(logits, batch[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(args.batch_delay)
        train_sampler.advance(len(batch))

        if is_save_step:
            checkpoint_directory = saver.prepare_checkpoint_directory()
            model_state, optimizer_state = get_state_dict(model, optimizer)
            dcp.save({"model": model_state, "optimizer": optimizer_state},
                     checkpoint_id=checkpoint_directory)
            if rank == 0:
                torch.save({"train_sampler": train_sampler.state_dict()},
                           os.path.join(checkpoint_directory, "train_state.pt"))
            saver.symlink_latest(checkpoint_directory)
        if is_last_step:
            timer.report(f"Epoch {epoch} [{step + 1}/{len(train_dataloader)}] loss {loss:.4f}")
    train_sampler.reset_progress()

full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                            cpu_offload=True))
if rank == 0 and args.final_weights:
    torch.save(full, args.final_weights)
dist.destroy_process_group()
