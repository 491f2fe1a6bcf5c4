"""CyclerCallback in one process, without cycle run: a stop request in the control file ends
train() after a committed checkpoint (exit_on_stop=False: it returns and stopped() says so), the
next train() resumes from it by itself, and a callback added after the Trainer was built is
named in one line."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers",
                                   reason="the [transformers] extra is not installed")

import torch  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402

from cycler import ConfigError, latest_checkpoint  # noqa: E402
from cycler.integrations import transformers as integration  # noqa: E402
from cycler.protocol.control import Action, ControlRequest, write_control  # noqa: E402

pytestmark = pytest.mark.integrations


class Tokens(Dataset):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        tokens = torch.arange(index, index + 8) % 16
        return {"input_ids": tokens, "labels": tokens}


def trainer(tmp_path: Path, callbacks: list, **arguments: object) -> transformers.Trainer:
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=16, n_positions=8, n_embd=16, n_layer=1,
                                     n_head=2)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"), per_device_train_batch_size=4, num_train_epochs=1,
        save_strategy="no", use_cpu=True, report_to=[], disable_tqdm=True,
        **arguments)  # type: ignore[arg-type]
    return transformers.Trainer(model=transformers.GPT2LMHeadModel(config), args=args,
                                train_dataset=Tokens(), callbacks=callbacks)


def test_a_stop_commits_returns_from_train_and_the_next_train_resumes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    control = tmp_path / "control.json"
    monkeypatch.setenv("CYCLER_CONTROL_FILE", str(control))  # what cycle run gives workers
    write_control(control, ControlRequest(sequence=1, action=Action.CHECKPOINT_AND_EXIT,
                                          reason="SIGTERM", requested_at=time.time()))
    root = tmp_path / "ck"
    output = trainer(tmp_path, [integration.CyclerCallback(root, exit_on_stop=False)]).train()
    assert integration.stopped() and output.metrics == {"stopped": True}
    latest = latest_checkpoint(root)
    assert latest is not None and (latest / "checkpoint-1" / "trainer_state.json").exists()

    write_control(control, ControlRequest(sequence=2, action=Action.RUN, reason="",
                                          requested_at=time.time()))
    resumed = trainer(tmp_path, [integration.CyclerCallback(root)])
    output = resumed.train(resume_from_checkpoint=True)
    assert not integration.stopped() and output.global_step == 8
    assert resumed.state.global_step == 8


def test_a_callback_added_after_the_trainer_was_built_is_named_in_one_line(
        tmp_path: Path) -> None:
    late = trainer(tmp_path, [])
    late.add_callback(integration.CyclerCallback(tmp_path / "ck"))
    with pytest.raises(ConfigError, match="added after the Trainer was built"):
        late.train()


@pytest.mark.parametrize(("save_total_limit", "keep_last"), [(3, 3), (1, 1), (None, -1), (0, -1),
                                                             (-2, -1)])
def test_save_total_limit_keeps_what_hf_keeps_and_none_or_below_one_keeps_all(
        tmp_path: Path, save_total_limit: int | None, keep_last: int) -> None:
    """HF rotates only above 0; a negative limit had reached the saver as keep_last=-2 and
    was refused inside train(), naming an argument the script never gave."""
    callback = integration.CyclerCallback(tmp_path / "ck")
    trainer(tmp_path, [callback], save_total_limit=save_total_limit)
    assert callback.saver().keep_last == keep_last
