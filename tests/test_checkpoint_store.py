"""Checkpoint completeness (manifest written last), choosing one to resume from, and retention."""

import json
import shutil

import pytest

from meds_cli.core.errors import UserError
from meds_cli.engine.run_folders.checkpoint_store import (
    MANIFEST,
    all_steps,
    begin_checkpoint,
    checkpoint_path,
    checkpoint_problem,
    find_usable_checkpoint,
    prune_checkpoints,
    publish_checkpoint,
    remove_checkpoint,
    require_checkpoint,
    write_manifest,
)


def make_checkpoint(run, step, *, finished=True):
    folder = checkpoint_path(run, step)
    (folder / "adapter").mkdir(parents=True)
    (folder / "weights.safetensors").write_bytes(bytes(range(256)) * 4)
    (folder / "adapter" / "adapter_config.json").write_text('{"r": 8}')
    (folder / "state.json").write_text(json.dumps({"step": step}))
    if finished:
        write_manifest(folder, step=step)
    return folder


def test_manifest_lists_every_file_with_size_and_checksum(tmp_path):
    folder = make_checkpoint(tmp_path, 2)
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["step"] == 2
    assert sorted(manifest["files"]) == ["adapter/adapter_config.json", "state.json", "weights.safetensors"]
    assert manifest["files"]["weights.safetensors"]["bytes"] == 1024
    import hashlib
    assert manifest["files"]["weights.safetensors"]["sha256"] == hashlib.sha256(bytes(range(256)) * 4).hexdigest()
    assert checkpoint_problem(folder) is None
    assert not list(folder.glob(".*partial"))


def test_problems_are_named(tmp_path):
    folder = make_checkpoint(tmp_path, 1)
    weights = folder / "weights.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:100])
    assert checkpoint_problem(folder) == "weights.safetensors is cut short (100 of 1024 bytes)"
    weights.write_bytes(data + b"x")
    assert checkpoint_problem(folder) == "weights.safetensors has 1025 bytes, not 1024"
    weights.write_bytes(bytes(1024))
    assert checkpoint_problem(folder) == "weights.safetensors does not match its checksum"
    assert checkpoint_problem(folder, deep=False) is None  # sizes only
    weights.unlink()
    assert checkpoint_problem(folder) == "weights.safetensors is missing"
    (folder / MANIFEST).write_text("{not json")
    assert checkpoint_problem(folder) == f"its {MANIFEST} is damaged"
    (folder / MANIFEST).write_text(json.dumps({"files": {"../../x": {"bytes": 1, "sha256": "0"}}}))
    assert "outside" in checkpoint_problem(folder)
    (folder / MANIFEST).unlink()
    assert checkpoint_problem(folder) == f"it has no {MANIFEST}, so it was never finished"


def test_resume_takes_the_newest_complete_and_says_what_it_passed_over(tmp_path):
    for step in (2, 4, 6):
        make_checkpoint(tmp_path, step)
    make_checkpoint(tmp_path, 8, finished=False)
    weights = checkpoint_path(tmp_path, 6) / "weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:10])
    said = []
    assert find_usable_checkpoint(tmp_path, say=said.append) == checkpoint_path(tmp_path, 4)
    assert said == [
        f"checkpoint {checkpoint_path(tmp_path, 8)} is unusable (it has no {MANIFEST}, so it was never finished); "
        "using step 4",
        f"checkpoint {checkpoint_path(tmp_path, 6)} is unusable (weights.safetensors is cut short (10 of 1024 bytes)); "
        "using step 4",
    ]


def test_step_picks_one_or_explains(tmp_path):
    for step in (2, 4):
        make_checkpoint(tmp_path, step)
    make_checkpoint(tmp_path, 6, finished=False)
    assert find_usable_checkpoint(tmp_path, 2) == checkpoint_path(tmp_path, 2)
    with pytest.raises(UserError, match=r"no checkpoint at step 3; checkpoints: 2, 4, 6"):
        find_usable_checkpoint(tmp_path, 3)
    with pytest.raises(UserError, match=r"step_6 is unusable: it has no manifest.json.*; complete checkpoints: 2, 4"):
        find_usable_checkpoint(tmp_path, 6)


def test_no_checkpoint_folder_is_none_and_none_usable_is_one_line(tmp_path):
    assert find_usable_checkpoint(tmp_path) is None
    with pytest.raises(UserError, match="has no checkpoint"):
        require_checkpoint(tmp_path)
    make_checkpoint(tmp_path, 1, finished=False)
    make_checkpoint(tmp_path, 2)
    (checkpoint_path(tmp_path, 2) / "state.json").unlink()
    with pytest.raises(UserError) as error:
        find_usable_checkpoint(tmp_path)
    message = str(error.value)
    assert "\n" not in message and "step 2: state.json is missing" in message and "step 1: it has no" in message
    assert f"delete {tmp_path / 'checkpoints'}" in message


def test_retention_keeps_the_newest_n_complete(tmp_path):
    for step in (1, 2, 3, 4, 5):
        make_checkpoint(tmp_path, step)
    (checkpoint_path(tmp_path, 3) / MANIFEST).unlink()  # broken, older than the newest complete
    leftover = tmp_path / "checkpoints" / ".step_9.tmp"
    leftover.mkdir()
    removed = prune_checkpoints(tmp_path, keep=2)
    assert all_steps(tmp_path) == [4, 5]
    assert checkpoint_path(tmp_path, 3) in removed and not leftover.exists()


def test_retention_never_deletes_the_newest_complete(tmp_path):
    make_checkpoint(tmp_path, 1)
    make_checkpoint(tmp_path, 2)
    make_checkpoint(tmp_path, 3, finished=False)  # newer but broken: not counted, not deleted
    prune_checkpoints(tmp_path, keep=1)
    assert all_steps(tmp_path) == [2, 3]
    assert checkpoint_problem(checkpoint_path(tmp_path, 2)) is None
    with pytest.raises(ValueError):
        prune_checkpoints(tmp_path, keep=-1)


def test_retention_without_any_complete_checkpoint_deletes_nothing(tmp_path):
    make_checkpoint(tmp_path, 1, finished=False)
    assert prune_checkpoints(tmp_path, keep=1) == []
    assert all_steps(tmp_path) == [1]


def test_keep_zero_keeps_all(tmp_path):
    for step in (1, 2, 3):
        make_checkpoint(tmp_path, step)
    prune_checkpoints(tmp_path, keep=0)
    assert all_steps(tmp_path) == [1, 2, 3]


def test_removal_drops_the_manifest_first(tmp_path, monkeypatch):
    folder = make_checkpoint(tmp_path, 1)
    import shutil

    monkeypatch.setattr(shutil, "rmtree", lambda *a, **k: None)  # as if killed right after the first unlink
    remove_checkpoint(folder)
    assert checkpoint_problem(folder) is not None


def test_retention_after_resuming_from_an_earlier_step_keeps_the_step_just_written(tmp_path):
    for step in (2, 4, 6, 8):
        make_checkpoint(tmp_path, step)
    shutil.rmtree(checkpoint_path(tmp_path, 4))  # resumed from step 2 (--step 2), now writes step 3
    make_checkpoint(tmp_path, 3)
    prune_checkpoints(tmp_path, keep=1, newest=3)
    assert all_steps(tmp_path) == [3, 6, 8]  # the later ones wait to be overwritten


def test_writing_a_checkpoint_publishes_it_whole(tmp_path):
    tmp = begin_checkpoint(tmp_path, 5)
    (tmp / "weights.safetensors").write_bytes(b"w")
    assert all_steps(tmp_path) == []  # the temporary folder is not a checkpoint
    write_manifest(tmp, step=5)
    final = publish_checkpoint(tmp, tmp_path, 5)
    assert final == checkpoint_path(tmp_path, 5) and not tmp.exists()
    assert checkpoint_problem(final) is None
