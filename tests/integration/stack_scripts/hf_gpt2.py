"""A tiny GPT-2 (from GPT2Config) trained by a Hugging Face Trainer on synthetic tokens, adopted
with one line: ``callbacks=[CyclerCallback()]``.

Usage: hf_gpt2.py --out DIR [--cycler] [--epochs N] [configuration options]. Rank 0 writes
DIR/final.pt (the weights) at the end of training; every rank prints "step S" after each
optimizer step.

The configurations the integration is tested on: ``--accumulate N``
(``gradient_accumulation_steps``), ``--evaluate`` (an evaluation at every save, the best model
loaded at the end: ``load_best_model_at_end``, ``save_total_limit=2``), ``--jit`` (HF's own
``enable_jit_checkpoint``; alone, the script resumes from the newest ``checkpoint-N`` itself),
``--no-unused-search`` (``ddp_find_unused_parameters=False``: DDP rebuilds its buckets).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

SEQUENCE, VOCAB = 16, 64


class Tokens(Dataset):
    def __init__(self, samples: int, seed: int = 7) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, VOCAB, (samples, SEQUENCE), generator=generator)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


class Pace(TrainerCallback):
    """Prints each step (the tests wait for them) and keeps a step long enough to stop at."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.delay)
        print(f"step {state.global_step}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cycler", action="store_true")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=160)
    parser.add_argument("--save-steps", type=int, default=25)
    parser.add_argument("--delay", type=float, default=0.05)
    parser.add_argument("--jit", action="store_true",
                        help="HF's own enable_jit_checkpoint; without --cycler the script "
                             "resumes from the newest checkpoint-N (the comparison in the docs)")
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--evaluate", action="store_true")
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--no-unused-search", action="store_true",
                        help="ddp_find_unused_parameters=False, as scripts set it to silence "
                             "DDP's warning (HF's default for a PreTrainedModel is True)")
    parser.add_argument("--resume-true", action="store_true",
                        help="train(resume_from_checkpoint=True), as a script written for HF's "
                             "own resume passes it")
    args = parser.parse_args()
    configuration: dict = {}
    if args.jit:  # the argument came in transformers 5: set only when asked for
        configuration["enable_jit_checkpoint"] = True
    if args.no_unused_search:
        configuration["ddp_find_unused_parameters"] = False
    if args.evaluate:
        configuration.update(eval_strategy="steps", eval_steps=args.save_steps,
                             load_best_model_at_end=True, save_total_limit=2,
                             per_device_eval_batch_size=4)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQUENCE, n_embd=32, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config)  # dropout on: exact resume needs every rank's RNG
    training = TrainingArguments(
        output_dir=str(args.out / "hf"), num_train_epochs=args.epochs,
        per_device_train_batch_size=4, learning_rate=1e-3, save_steps=args.save_steps,
        logging_steps=10, seed=0, use_cpu=True, ddp_backend="gloo", report_to=[],
        disable_tqdm=True, dataloader_num_workers=0,
        gradient_accumulation_steps=args.accumulate, max_steps=args.max_steps, **configuration)
    callbacks: list[TrainerCallback] = [Pace(args.delay)]
    if args.cycler:  # imported only then: the other variants are scripts that know no cycler
        from cycler.integrations.transformers import CyclerCallback

        callbacks.append(CyclerCallback())
    trainer = Trainer(model=model, args=training, train_dataset=Tokens(args.samples),
                      eval_dataset=Tokens(16, seed=8) if args.evaluate else None,
                      callbacks=callbacks)
    resume = None  # with cycler: the newest commit, by itself
    if args.resume_true or (args.jit and not args.cycler and any(
            (args.out / "hf").glob("checkpoint-*"))):
        resume = True
    trainer.train(resume_from_checkpoint=resume)
    if trainer.is_world_process_zero():
        torch.save({k: v.clone() for k, v in trainer.model.state_dict().items()},
                   args.out / "final.pt")
        print(f"training finished, best {trainer.state.best_model_checkpoint}", flush=True)


if __name__ == "__main__":
    main()
