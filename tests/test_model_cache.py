"""The meds cache: one dequantized copy per GGUF content (not per path: every fresh clone's venv
used to add a 540 MB copy of the embedded model), and a failed or interrupted write leaves
nothing behind and says what to do in one line."""

import errno
import os
import shutil
import socket
import subprocess
import sys

import pytest
import torch
from typer.testing import CliRunner

from meds_cli.app import app
from meds_cli.core.errors import UserError
from meds_cli.engine.model_io import cache as cache_module
from meds_cli.engine.model_io.cache import file_digest, publish_folder, remove_abandoned, reuse
from meds_cli.engine.model_io.model import dequantized_copy
from tests.cli_errors import one_error_line
from tests.conftest import needs_embedded


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("MEDS_CACHE", str(folder))
    return folder


def write_model(folder):
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "config.json").write_text("{}")


def test_same_bytes_anywhere_share_one_digest(tmp_path, cache):
    first = tmp_path / "a" / "m.gguf"
    first.parent.mkdir()
    first.write_bytes(b"GGUF" + bytes(range(256)) * 100)
    second = tmp_path / "b" / "m.gguf"
    second.parent.mkdir()
    shutil.copyfile(first, second)
    os.utime(second, ns=(1, 1))  # another place, another mtime: a reinstall, a fresh clone's venv
    assert file_digest(first) == file_digest(second)
    changed = bytearray(first.read_bytes())
    changed[5000] ^= 1
    third = tmp_path / "c.gguf"
    third.write_bytes(bytes(changed))
    assert file_digest(third) != file_digest(first)


def test_digest_is_remembered_and_a_damaged_memo_is_ignored(tmp_path, cache, monkeypatch):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" + b"x" * 5000)
    digest = file_digest(path)
    (memo,) = (cache / "digests").iterdir()
    assert memo.read_text() == digest
    reads = []
    real_open = type(path).open
    monkeypatch.setattr(type(path), "open", lambda self, *a, **k: reads.append(self) or real_open(self, *a, **k))
    assert file_digest(path) == digest and path not in reads  # the memo answered
    memo.write_text("0123")  # cut short by a writer that died
    assert file_digest(path) == digest and path in reads
    assert memo.read_text() == digest


def test_a_cached_copy_is_found_from_another_path_of_the_same_file(tmp_path, cache):
    first = tmp_path / "venv1" / "SmolLM2.gguf"
    first.parent.mkdir()
    first.write_bytes(b"GGUF not parsed: the cached copy answers first")
    target = cache / "gguf" / f"SmolLM2-{file_digest(first)[:16]}"
    target.parent.mkdir(parents=True)
    write_model(target)
    second = tmp_path / "venv2" / "SmolLM2.gguf"
    second.parent.mkdir()
    shutil.copyfile(first, second)
    assert dequantized_copy(first) == target
    assert dequantized_copy(second) == target
    assert sorted(p.name for p in (cache / "gguf").iterdir()) == [target.name]


def test_publish_renames_a_whole_folder_into_place(tmp_path):
    target = tmp_path / "cache" / "model-1"
    seen = []

    def write(folder):
        seen.append(folder)
        assert not target.exists()  # nothing at the final name until the copy is whole
        write_model(folder)

    assert publish_folder(target, write) == target
    assert (target / "model.safetensors").read_bytes() == b"weights"
    assert seen[0].name == f"model-1.partial-{socket.gethostname()}-{os.getpid()}" and not seen[0].exists()


@pytest.mark.parametrize("failure", [
    OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
    # safetensors' own error type, which only names the OS error in its text
    RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)"),
])
def test_a_full_disk_mid_write_leaves_nothing_and_is_one_line(tmp_path, failure):
    target = tmp_path / "cache" / "model-1"

    def write(folder):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"half of the weights")
        raise failure

    with pytest.raises(UserError) as raised:
        publish_folder(target, write)
    message = str(raised.value)
    assert "No space left on device" in message and str(target.parent) in message and "MEDS_CACHE" in message
    assert "\n" not in message
    assert list(target.parent.iterdir()) == []


@pytest.mark.parametrize("failure", [ValueError("a bug"), KeyboardInterrupt()])
def test_other_failures_propagate_and_leave_nothing(tmp_path, failure):
    target = tmp_path / "cache" / "model-1"

    def write(folder):
        write_model(folder)
        raise failure

    with pytest.raises(type(failure)):
        publish_folder(target, write)
    assert list(target.parent.iterdir()) == []


def test_a_copy_finished_first_by_another_process_wins(tmp_path):
    target = tmp_path / "cache" / "model-1"

    def write(folder):
        write_model(folder)
        write_model(target)  # the other process renamed its copy in while this one wrote

    assert publish_folder(target, write) == target
    assert [p.name for p in target.parent.iterdir()] == ["model-1"]


def test_folders_of_dead_writers_are_removed_and_others_kept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)  # exited: no process has this id now (ids are not reused this fast)
    host = socket.gethostname()
    folder = tmp_path / "gguf"
    folder.mkdir()
    abandoned = folder / f"model-1{cache_module.PARTIAL}{host}-{dead_pid}"
    live = folder / f"model-2{cache_module.PARTIAL}{host}-{os.getppid()}"
    # another node of a cluster sharing the cache: its process ids mean nothing here
    elsewhere = folder / f"model-4{cache_module.PARTIAL}other-node-7-{dead_pid}"
    whole = folder / "model-3"
    for path in (abandoned, live, elsewhere, whole):
        write_model(path)
    remove_abandoned(folder)
    assert sorted(p.name for p in folder.iterdir()) == sorted([live.name, elsewhere.name, whole.name])


@needs_embedded
def test_cache_that_cannot_be_written_is_one_line_for_train(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv("MEDS_CACHE", str(blocker / "cache"))
    result = CliRunner().invoke(app, ["train", "--model", "smollm2-135m", "--steps", "1",
                                      "--output", str(tmp_path / "run")])
    line = one_error_line(result)
    assert "meds cache" in line and "MEDS_CACHE" in line and str(blocker) in line
    assert not (tmp_path / "run").exists()


def test_keep_leaves_the_most_recently_used_copies(tmp_path):
    folder = tmp_path / "eval-merged"
    for i, name in enumerate(["step_1", "step_2"]):
        publish_folder(folder / name, write_model, keep=2)
        os.utime(folder / name, (1000 + i, 1000 + i))
    assert reuse(folder / "step_1")  # used again: now the newest
    in_progress = folder / f"step_9{cache_module.PARTIAL}other-host-1"  # another writer's, config.json first
    write_model(in_progress)
    os.utime(in_progress, (1, 1))
    publish_folder(folder / "step_3", write_model, keep=2)
    assert sorted(p.name for p in folder.iterdir()) == sorted(["step_1", "step_3", in_progress.name])
    assert not reuse(folder / "step_2")


def test_a_full_fine_tune_is_merged_once_into_the_cache_for_vllm(tmp_path, cache, monkeypatch):
    from safetensors.torch import save_file

    from meds_cli.engine.model_io.tiny import tiny_model_and_tokenizer
    from meds_cli.engine.rollout.eval_backends import ModelSpec, _merged_copy

    base, tokenizer = tiny_model_and_tokenizer(layers=2, hidden=32)
    base.save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    trained = {name: tensor + 1.0 for name, tensor in base.state_dict().items() if "layers.1.mlp" in name}
    assert trained  # the checkpoint changes some weights, so applying it shows
    checkpoint = tmp_path / "run" / "checkpoints" / "step_2"
    checkpoint.mkdir(parents=True)
    save_file(trained, str(checkpoint / "weights.safetensors"))
    spec = ModelSpec(name=str(tmp_path / "base"), checkpoint=checkpoint, dtype="float32")

    merged = _merged_copy(spec)
    assert merged.parent == cache / "eval-merged" and [p.name for p in merged.parent.iterdir()] == [merged.name]
    from transformers import AutoModelForCausalLM

    state = AutoModelForCausalLM.from_pretrained(merged).state_dict()
    for name, tensor in base.state_dict().items():
        assert torch.equal(state[name], trained.get(name, tensor)), name
    monkeypatch.setattr("meds_cli.engine.model_io.model.load_model_and_tokenizer",
                        lambda *a, **k: pytest.fail("merged again"))
    assert _merged_copy(spec) == merged


def test_a_new_copy_removes_the_path_keyed_copies_older_meds_made(tmp_path, cache, monkeypatch):
    from meds_cli.engine.model_io import model as model_module

    gguf = tmp_path / "SmolLM2.gguf"
    gguf.write_bytes(b"GGUF" + b"\x00" * 64)
    folder = cache / "gguf"
    folder.mkdir(parents=True)
    legacy = [folder / "SmolLM2-02319df48a2f66be", folder / "SmolLM2-0afbfe4f086a6745"]
    other_model = folder / "Qwen-5fc4dc5600c5da7d"  # another file's copies: not this one's to remove
    other_name = folder / "SmolLM2-instruct-5fc4dc5600c5da7d"
    for path in (*legacy, other_model, other_name):
        write_model(path)
    converted = []
    monkeypatch.setattr(model_module, "_dequantize", lambda source, out: converted.append(source) or write_model(out))

    target = dequantized_copy(gguf)
    assert converted == [gguf] and (target / model_module.COPY_SOURCE).is_file()
    assert sorted(p.name for p in folder.iterdir()) == sorted([target.name, other_model.name, other_name.name])
    assert dequantized_copy(gguf) == target and converted == [gguf]  # kept: it is keyed by content


def test_an_empty_meds_cache_means_the_default(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("MEDS_CACHE", "")
    assert cache_module.cache_dir() == tmp_path / ".cache" / "meds"
    monkeypatch.setenv("MEDS_CACHE", str(tmp_path / "elsewhere"))
    assert cache_module.cache_dir() == tmp_path / "elsewhere"
