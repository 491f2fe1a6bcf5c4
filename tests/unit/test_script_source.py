"""What a script's source says about forking its workers: environment writes before torch."""

from __future__ import annotations

from pathlib import Path

import pytest

from cycler.supervisor.launch.launcher import _processes_per_node
from cycler.supervisor.launch.script_source import (
    environment_set_before_torch,
    environment_writes,
    first_torch_import,
)


@pytest.mark.parametrize("write, name", [
    ('os.environ["OMP_NUM_THREADS"] = "2"', "OMP_NUM_THREADS"),
    ('os.environ.setdefault("TORCH_LOGS", "+dynamo")', "TORCH_LOGS"),
    ('os.environ.update({"A": "1"})', "os.environ.update"),
    ('os.putenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")', "CUBLAS_WORKSPACE_CONFIG"),
    ('del os.environ["X"]', "X"),
    ('os.environ |= {"A": "1"}', "os.environ |="),
    ("load_dotenv()", "load_dotenv"),
])
def test_each_way_of_writing_the_environment_before_torch_is_found(write: str, name: str) -> None:
    source = f"import os\n{write}\nimport torch\n".encode()
    found = environment_set_before_torch(source)
    assert found is not None and (found.line, found.name) == (2, name)


def test_an_alias_of_the_environment_counts_as_the_environment() -> None:
    source = b"from os import environ as env\nenv['A'] = '1'\nimport torch\n"
    assert environment_set_before_torch(source) is not None
    source = b"import os\ne = os.environ\ne['A'] = '1'\nimport torch\n"
    assert environment_set_before_torch(source) is not None


def test_a_write_inside_a_function_before_the_import_counts() -> None:
    source = b"import os\ndef main():\n    os.environ['A'] = '1'\n    import torch\nmain()\n"
    assert environment_set_before_torch(source) is not None


def test_a_write_after_torch_is_imported_changes_nothing_a_fork_changes() -> None:
    source = b"import os\nimport torch.nn as nn\nos.environ['A'] = '1'\n"
    assert environment_set_before_torch(source) is None
    assert [write.name for write in environment_writes(source)] == ["A"]


def test_a_script_that_never_imports_torch_itself_counts_every_write() -> None:
    source = b"import os\nimport transformers\nos.environ['A'] = '1'\n"
    assert environment_set_before_torch(source) is not None


def test_reading_the_environment_is_not_writing_it() -> None:
    source = b"import os\nx = os.environ.get('A')\ny = os.environ['B']\nimport torch\n"
    assert environment_set_before_torch(source) is None


def test_a_script_that_does_not_parse_has_no_writes_and_no_import() -> None:
    assert environment_writes(b"this is not python ((\n") == []
    assert first_torch_import(b"os.environ['A'] = (\n") is None


def test_the_first_torch_import_is_found_in_any_spelling() -> None:
    assert first_torch_import(b"import os\nfrom torch import nn\n") == 2
    assert first_torch_import(b"import os, torch.distributed as dist\n") == 1
    assert first_torch_import(b"import torchvision\nfrom . import torch\n") is None


@pytest.mark.parametrize("arguments, count", [
    (["--nproc-per-node", "2", "--nnodes", "1", "train.py"], 2),
    (["--nproc_per_node=4", "train.py"], 4),
    (["--nnodes", "1", "train.py"], 1),
    (["--nproc-per-node", "gpu", "train.py"], 1),
])
def test_the_launcher_reads_the_processes_per_node_before_it_imports_torch(
        arguments: list[str], count: int) -> None:
    assert _processes_per_node(arguments) == count


def test_the_agent_leaves_dynamo_to_a_script_that_sets_what_dynamo_reads(tmp_path: Path) -> None:
    from cycler.supervisor.launch.torchrun import fork_preloads

    script = tmp_path / "train.py"
    ddp = "import os, torch\nfrom torch.nn.parallel import DistributedDataParallel\n"
    script.write_text(ddp + "os.environ['TORCHINDUCTOR_CACHE_DIR'] = '/x'\n")
    assert fork_preloads(script) == "1"
    script.write_text(ddp + "os.environ.update(dict(A='1'))\n")
    assert fork_preloads(script) == "1"
    script.write_text(ddp + "os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':4096:8')\n")
    assert fork_preloads(script) == "torch._dynamo"


def test_an_import_under_type_checking_is_not_torch_imported() -> None:
    source = (b"from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n"
              b"import os\nos.environ['OMP_NUM_THREADS'] = '2'\nimport torch\n")
    assert first_torch_import(source) == 6
    assert environment_set_before_torch(source) is not None


def test_an_import_in_a_function_runs_when_called_perhaps_after_a_write_below_it() -> None:
    source = (b"import os\ndef main():\n    import torch\n"
              b"if __name__ == '__main__':\n    os.environ['TORCH_LOGS'] = '+dynamo'\n    main()\n")
    assert first_torch_import(source) is None
    assert environment_set_before_torch(source) is not None


def test_imports_in_the_module_blocks_run_with_it() -> None:
    source = (b"import os\ntry:\n    import numpy\nexcept ImportError:\n    pass\n"
              b"with open(__file__):\n    if True:\n        import torch\n")
    assert first_torch_import(source) == 8
    assert first_torch_import(b"try:\n    pass\nexcept ImportError:\n    import torch\n") == 4
