"""What an older torch than the newest cycler knows gets: the features that need a newer one
say so in one error; the rest works (CI runs the unit tests and one end-to-end resume on the
oldest supported torch, CONTRIBUTING.md says which)."""

from __future__ import annotations

import pytest
import torch

from cycler import AtomicDirectory
from cycler.errors import UnsupportedTorch

try:
    from torch.distributed.checkpoint.staging import DefaultStager  # noqa: F401
except ImportError:
    HAS_DEFAULT_STAGER = False
else:
    HAS_DEFAULT_STAGER = True


@pytest.mark.skipif(HAS_DEFAULT_STAGER, reason=f"torch {torch.__version__} has DCP's "
                    "DefaultStager: asynchronous saves work (tests/unit/test_async_save.py)")
def test_an_asynchronous_save_on_a_torch_without_the_stager_is_one_clear_error(tmp_path) -> None:
    saver = AtomicDirectory(tmp_path)
    with pytest.raises(UnsupportedTorch, match=r"asynchronous saves need torch 2\.9 or newer.*"
                       r"asynchronous=False"):
        saver.save({"w": torch.zeros(3)}, asynchronous=True)
    saver.save({"w": torch.ones(3)})  # a synchronous save still works, and commits
    assert saver.latest_checkpoint() is not None
