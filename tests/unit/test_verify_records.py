"""verify knows which files and values of a stack are records of a run (logs, wall-clock
times, paths, a stop's flags) rather than its training state: it leaves them out of the
comparison and lists them; everything else still differs where it differs."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import torch

from cycler.verify.causes import mid_accumulation, name_cause
from cycler.verify.compare import compare_checkpoints
from cycler.verify.records import record_file, record_value
from cycler.verify.session import seen_to_vary


def hf_checkpoint(directory: Path, *, runtime: float, loss: float, stop: bool,
                  output: str, weight: float = 1.0) -> list[str]:
    folder = directory / "checkpoint-8"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({
        "global_step": 8, "epoch": 0.5, "best_model_checkpoint": output + "/checkpoint-8",
        "log_history": [{"loss": loss, "step": 5}, {"train_runtime": runtime}],
        "stateful_callbacks": {"TrainerControl": {"args": {"should_training_stop": stop,
                                                           "should_save": True}}}}))
    torch.save({"state": {0: {"exp_avg": torch.full((2,), weight)}},
                "param_groups": [{"lr": 0.001, "params": [0]}]}, folder / "optimizer.pt")
    torch.save({"python": 1, "cpu": torch.Generator().manual_seed(0).get_state()},
               folder / "rng_state_0.pth")
    (folder / "training_args.bin").write_bytes(pickle.dumps({"logging_dir": output + "/runs/x"}))
    return [str(p.relative_to(directory)) for p in folder.iterdir()]


def test_hf_log_history_times_paths_flags_and_training_args_are_skipped_and_listed(
        tmp_path: Path) -> None:
    files = hf_checkpoint(tmp_path / "a", runtime=3.2, loss=2.5, stop=False, output="/s/ref")
    hf_checkpoint(tmp_path / "b", runtime=9.9, loss=2.4, stop=True, output="/s/int")
    diff = compare_checkpoints(tmp_path / "a", tmp_path / "b", files, trusted=True)
    assert diff.identical, diff.differences
    skipped = {item.where: item.why for item in diff.skipped}
    assert "checkpoint-8/trainer_state.json: log_history" in skipped
    assert "checkpoint-8/trainer_state.json: best_model_checkpoint" in skipped
    assert any("should_training_stop" in where for where in skipped)
    assert skipped["checkpoint-8/training_args.bin"].startswith("HF's TrainingArguments")


def test_a_state_difference_beside_the_records_is_still_found(tmp_path: Path) -> None:
    files = hf_checkpoint(tmp_path / "a", runtime=3.2, loss=2.5, stop=False, output="/s/ref")
    hf_checkpoint(tmp_path / "b", runtime=3.2, loss=2.5, stop=False, output="/s/ref",
                  weight=2.0)
    diff = compare_checkpoints(tmp_path / "a", tmp_path / "b", files, trusted=True)
    assert [d.where() for d in diff.differences] == \
        ["checkpoint-8/optimizer.pt: state.0.exp_avg"]


def test_hf_and_accelerate_rank_files_count_as_every_ranks_own_state(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        torch.save({"w": torch.ones(2) * (name == "a")}, tmp_path / name / "model.pt")
    files = ["model.pt", "rng_state_0.pth", "rng_state_1.pth", "random_states_0.pkl"]
    diff = compare_checkpoints(tmp_path / "a", tmp_path / "b", ["model.pt"], trusted=True)
    cause = name_cause(diff, world_size=2, files=files)
    assert cause.name != "rank_state"


def test_logs_and_lightning_version_folders_are_records_and_state_files_are_not() -> None:
    assert record_file("lightning_logs/version_3/metrics.csv")
    assert record_file("out/runs/Nov27_host/events.out.tfevents.1.host")
    assert record_file("wandb/run-1/files/config.yaml")
    for state in ("checkpoint-8/rng_state_1.pth", "optimizer.bin", "scheduler.bin",
                  "random_states_0.pkl", "model.safetensors", "lightning.ckpt", "final.pt",
                  "sampler.bin", "dl_state_dict.bin"):
        assert record_file(state) is None, state


def test_a_json_lines_log_in_a_working_directory_is_a_record() -> None:
    # A resumed run appends its lines again (with their times): its log.jsonl made an exact
    # resume DIFFERENT at the end of training.
    assert record_file("out/log.jsonl", in_workdir=True)
    assert record_file("metrics.ndjson", in_workdir=True)
    assert record_file("metrics.json", in_workdir=True) is None


def test_values_are_records_only_when_named_or_shaped_as_times_logs_or_paths() -> None:
    assert record_value(("train_runtime",), 1.0, 2.0)
    assert record_value(("callbacks", "ModelCheckpoint", "dirpath"), "/a", "/b")
    assert record_value(("best_k_models", "/s/ref/epoch=1.ckpt"), 0.5, None)
    for state in (("optimizer", "param_groups", "0", "lr"), ("epoch",), ("global_step",),
                  ("loops", "fit_loop", "state_dict", "combined_loader", "0", "batches_done"),
                  ("format",), ("name",)):
        assert record_value(state, 1, 2) is None, state
    assert record_value(("name",), "train/loss", "val/loss") is None


def test_a_resume_from_the_middle_of_a_gradient_accumulation_is_named() -> None:
    def counters(batches: int, steps: int) -> dict[tuple[str, ...], object]:
        loop = ("lightning.ckpt", "loops", "fit_loop", "epoch_loop")
        return {(*loop, "batch_progress", "total", "processed"): batches,
                (*loop, "automatic_optimization", "optim_progress", "optimizer", "step",
                 "total", "completed"): steps}

    assert mid_accumulation(counters(13, 6)) is not None
    assert mid_accumulation(counters(12, 6)) is None  # after an optimizer step
    assert mid_accumulation(counters(13, 13)) is None  # no accumulation
    assert mid_accumulation({}) is None


def test_throughputs_and_durations_in_seconds_or_ms_are_wall_clock_readings() -> None:
    # Written into a checkpoint only from the first evaluation on (after the determinism
    # check's checkpoints), they made an exact resume DIFFERENT.
    for name in ("eval_seconds", "last_eval_secs", "tokens_per_sec", "samples_per_s",
                 "step_ms", "mfu", "throughput"):
        assert record_value(("stats", name), 1.25, 1.5), name
    for name in ("ms_ssim", "lr", "loss", "lr_s"):
        assert record_value(("stats", name), 0.5, 0.6) is None, name
    assert record_value(("stats", "seconds"), 5, 6) is None  # an integer: a counter


def test_an_integer_under_a_time_name_is_a_counter_and_a_float_there_a_wall_clock_time() -> None:
    assert record_value(("time",), 5, 6) is None
    assert record_value(("optimizer", "timestamp"), 7, 8) is None
    assert record_value(("time",), 1.5, 2.5)
    assert record_value(("created_at",), "2026-11-27", "2026-11-28")


def test_a_tensor_under_a_time_like_name_is_state_not_a_wall_clock_time() -> None:
    # A diffusion model's time embedding or a TTS duration predictor: their weights were left
    # out of every comparison as "a wall-clock time", so a resume that changed only them was
    # IDENTICAL.
    for key in ("time_embedding.linear_1.weight", "duration_predictor.0.bias", "t_at"):
        assert record_value(("model", key), torch.ones(2), torch.zeros(2)) is None, key
    assert record_value(("time_embed",), torch.ones(2), None) is None
    assert record_value(("time_elapsed",), 1.5, 2.5)  # a clock's float stays a record


def test_what_two_uninterrupted_runs_differ_in_is_a_record_unless_rng_data_or_a_tensor(
        tmp_path: Path) -> None:
    for name, clock in (("a", 1.0), ("b", 2.0)):
        (tmp_path / name).mkdir()
        torch.save({"t": clock, "host": f"node{clock}", "optimizer": {"t": 3},
                    "sampler": {"position": int(clock)}, "rng": {"python": [int(clock)]},
                    "w": torch.ones(2) * clock}, tmp_path / name / "train.pt")
    diff = compare_checkpoints(tmp_path / "a", tmp_path / "b", ["train.pt"], trusted=True)
    varies = {".".join(d.key) for d in seen_to_vary(diff)}
    assert varies == {"t", "host"}
