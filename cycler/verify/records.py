"""Which files and values of a run are records of it, not its training state.

Two runs that train identically still write different logs: a wall-clock time, a path with
the run's own directory in it, a log a resume shortens or a new ``version_N`` folder each start
makes. verify leaves those out of every comparison and says which it left out and why; all
else (model, optimizer, scheduler, scaler, RNG, data position, an integration's own state) is
compared bit for bit. A pure function of names and values: the stacks' files are named here.

- Whole files: logs (TensorBoard, ``*.log``, W&B, MLflow; in a working directory also
  ``*.txt``, ``*.csv``, ``*.jsonl`` and plots: in a checkpoint a ``step.txt`` is state),
  files in a run's working directory that the other run did not write and whose names hold
  a number (a time, a pid, a start count), Lightning's ``version_N``
  folders (its logger and ModelCheckpoint write into a new one at each start), HF's
  ``TrainingArguments`` (``training_args.bin``: the configuration, with paths and a
  time-stamped logging directory).
- Values inside a state file: a run's log history (HF's ``log_history``: a resume averages
  its logged loss over fewer steps), wall-clock times (a float or a string named as one:
  ``train_runtime``, ``*_per_second``, ``time_elapsed``, ``created_at``...; an integer under
  such a name is a counter, a tensor (``time_embedding.linear_1.weight``) weights: state),
  and paths (an absolute or ``./`` string, or a field named as one:
  ``best_model_checkpoint``, ``dirpath``, ``*_path``, ``*_dir``), and the flags of the
  moment of a save (HF's ``TrainerControl.should_training_stop``: a stop's checkpoint says
  stop, a periodic one at the same step does not).

- Values that differ between two uninterrupted runs of the script (verify's determinism check
  runs it twice before the first interruption), by observation rather than by name: a number
  or a string outside the RNG and the data position that differs there is a record (a
  wall-clock time under any name, ``t`` included; a pid; a host) and is left out of every
  later comparison (``session.seen_to_vary``). A counter named ``t`` is equal in both runs
  and stays state. A tensor, an RNG state or a data position that differs there is nondeterminism.

State files are never records, whatever their names: HF's ``rng_state_N.pth``,
``optimizer.pt``, ``scheduler.pt``, ``scaler.pt``, ``trainer_state.json`` (but for the values
above); Accelerate's ``optimizer.bin``, ``scheduler.bin``, ``random_states_N.pkl``,
``sampler*.bin``, ``dl_state_dict*.bin``, ``custom_checkpoint_N.pkl``, ``model.safetensors``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_FILES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"(^|/)events\.out\.tfevents\."), "a TensorBoard log"),
    (re.compile(r"(^|/)(wandb|mlruns|lightning_logs|tb_logs|tensorboard)/"),
     "a logger's folder (W&B, MLflow, Lightning, TensorBoard)"),
    (re.compile(r"(^|/)version_\d+/"),
     "Lightning's version_N folder (its logger and ModelCheckpoint start a new one at each "
     "start)"),
    (re.compile(r"(^|/)(metrics\.csv|hparams\.yaml)$"), "Lightning's CSV log"),
    (re.compile(r"\.(log|out|err)$"), "a log"),
    (re.compile(r"(^|/)training_args\.bin$"),
     "HF's TrainingArguments (the configuration, with paths and a time-stamped logging_dir)"),
    (re.compile(r"(^|/)__pycache__/|\.pyc$"), "Python's bytecode cache"),
]
_LOGS = re.compile(r"^(log_history|logs?)$")
_FLAGS = re.compile(r"^should_(training_stop|save|evaluate|log|epoch_stop)$")
_TIMES = re.compile(r"(^|_)(time|times|timestamp|runtime|duration|elapsed|date|datetime|"
                    r"wall|created|started|finished|seconds|secs|throughput|mfu)($|_)|"
                    r"_per_sec(ond)?s?$|_per_s$|_ms$|_at$")
_PATH_FIELDS = re.compile(r"(^|_)(path|paths|dir|dirpath|directory|filename|filepath|"
                          r"best_model_checkpoint|checkpoint_path|output_dir|logging_dir)$")


@dataclass(frozen=True)
class Skipped:
    """A file or value left out of the comparison, and why."""

    where: str
    why: str


_WORKDIR_FILES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\.(txt|csv|tsv|jsonl|ndjson)$"), "a text, CSV or JSON-lines log"),
    (re.compile(r"\.(png|jpe?g|svg|pdf|html)$"), "a plot or report"),
]
"""Records only in a run's working directory: inside a checkpoint a ``step.txt`` is state."""


def record_file(name: str, *, in_workdir: bool = False) -> str | None:
    """Why the file ``name`` (relative to a checkpoint, or to a run's working directory) is a
    record of the run (``None``: it is state)."""
    for pattern, why in [*_FILES, *(_WORKDIR_FILES if in_workdir else [])]:
        if pattern.search(name):
            return why
    return None


def record_value(key: tuple[str, ...], left: Any, right: Any) -> str | None:
    """Why the value at ``key`` (its path of keys in a state file) is a record of the run
    (``None``: it is state). ``left`` and ``right`` are the two runs' values there."""
    words = [k.lower() for k in key]
    if any(_LOGS.match(word) for word in words):
        return "the run's log (a resume averages what it logs over fewer steps)"
    if words and _FLAGS.match(words[-1]):
        return ("a flag of the moment of the save (HF's TrainerControl: a stop's checkpoint "
                "says stop)")
    if words and _TIMES.search(words[-1]) and _clock_reading(left, right):
        return "a wall-clock time"
    if any(_is_path(word) for word in key) or any(
            isinstance(v, str) and _is_path(v) for v in (left, right)) or (
            words and _PATH_FIELDS.search(words[-1])
            and all(isinstance(v, str) or v is None for v in (left, right))):
        return "a path (each run works in a directory of its own)"
    return None


def _clock_reading(*values: Any) -> bool:
    """Values a clock could give: floats or strings, or absent (an integer is a counter; a
    tensor is state: ``time_embedding.linear_1.weight``, ``duration_predictor.bias``)."""
    return not _counts(*values) and not any(hasattr(v, "shape") for v in values)


def _counts(*values: Any) -> bool:
    """Integers (a step counter named ``time`` is state; a time stamp in integers differs
    between two uninterrupted runs and is seen as a record there)."""
    return all(isinstance(v, int) and not isinstance(v, bool) for v in values)


def _is_path(text: str) -> bool:
    return text.startswith(("/", "./", "../")) and len(text) > 1


ONLY_ONE_RUN = "a file only one run wrote (its name holds a time, a pid, a host or a start count)"

VARIES = ("differs between two uninterrupted runs of the script (a wall-clock time, a pid, a "
          "host under a name of the script's own)")
