"""AtomicDirectory.save(asynchronous=True) in one process: the directory is prepared in the
background, the handle names it, a failure there reaches whoever waits, and the saver goes on."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from cycler import AtomicDirectory, latest_checkpoint, list_checkpoints, read_manifest

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning")]
try:
    from torch.distributed.checkpoint.staging import DefaultStager  # noqa: F401
except ImportError:  # tests/unit/test_torch_versions.py checks the error instead
    pytestmark.append(pytest.mark.skip(reason=f"torch {torch.__version__} has no DCP "
                                       "DefaultStager: asynchronous saves need torch 2.9"))


def test_back_to_back_async_saves_each_commit_in_order_and_name_their_directory(
        tmp_path: Path) -> None:
    saver = AtomicDirectory(tmp_path, keep_last=2)
    weights = torch.zeros(1000)
    handles = []
    for step in range(3):
        weights.fill_(float(step))
        handles.append(saver.save({"weights": weights}, metadata={"step": step},
                                  asynchronous=True))
    saver.wait()
    assert [Path(h.directory).name for h in handles] == [
        f"AtomicDirectory_checkpoint_{index}" for index in range(3)]
    assert all(h.done() for h in handles)
    assert latest_checkpoint(tmp_path) == Path(handles[-1].directory)
    assert read_manifest(Path(handles[-1].directory)).step == 2
    assert [c.index for c in list_checkpoints(tmp_path)] == [1, 2]  # keep_last=2 applied
    loaded = {"weights": torch.empty(1000)}
    assert saver.load(loaded) == {"step": 2}
    assert torch.equal(loaded["weights"], torch.full((1000,), 2.0))


def test_a_failure_in_the_background_reaches_the_handle_and_the_next_save_succeeds(
        tmp_path: Path) -> None:
    saver = AtomicDirectory(tmp_path)
    handle = saver.save({"weights": torch.ones(10)}, metadata={"bad": object()},
                        asynchronous=True)
    with pytest.raises(TypeError, match="JSON-serialisable"):
        handle.wait()
    with pytest.raises(TypeError, match="JSON-serialisable"):
        saver.wait()  # once: the saver then goes on
    failed = handle.directory  # prepared before the commit failed
    good = saver.save({"weights": torch.ones(10)}, metadata={"step": 1}, asynchronous=True)
    good.wait()
    saver.wait()
    assert latest_checkpoint(tmp_path) == Path(good.directory)
    assert not Path(failed).exists(), "the failed save's directory is removed by the next commit"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing torn or corrupt is left to warn about
        assert [c.index for c in list_checkpoints(tmp_path)] == [1]


@pytest.mark.parametrize("next_call", ["save", "prepare_checkpoint_directory"])
def test_a_failed_async_save_the_script_was_told_of_does_not_fail_its_next_save(
        tmp_path: Path, next_call: str) -> None:
    """The handle's wait() raised the failure: the script handled it, so the saver's next
    save (either API) commits instead of raising the same failure again."""
    saver = AtomicDirectory(tmp_path)
    handle = saver.save({"weights": torch.ones(10)}, metadata={"bad": object()},
                        asynchronous=True)
    with pytest.raises(TypeError, match="JSON-serialisable"):
        handle.wait()
    if next_call == "save":
        saver.save({"weights": torch.ones(10)}, metadata={"step": 1})
    else:
        directory = Path(saver.prepare_checkpoint_directory())
        torch.save({"weights": torch.ones(10)}, directory / "model.pt")
        saver.symlink_latest(directory, metadata={"step": 1})
    latest = saver.latest_checkpoint()
    assert latest is not None and read_manifest(Path(latest)).step == 1
