"""Bad --model and --dtype values end in one line each (exit 2, no traceback), and a training run
refuses them before its run folder is kept."""

import json

import pytest
from typer.testing import CliRunner

from meds_cli.app import app
from meds_cli.core.errors import UserError
from meds_cli.engine.model_io.model import load_model_and_tokenizer, precheck_model
from tests.cli_errors import one_error_line


def bad_models(tmp_path) -> dict:
    text = tmp_path / "weights.txt"
    text.write_text("not a model")
    no_header = tmp_path / "no-header.gguf"
    no_header.write_bytes(b"PK\x03\x04 a zip, not a gguf")
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 9)  # the header, then nothing a parser can use
    empty_dir = tmp_path / "empty-model"
    empty_dir.mkdir()
    bad_json = tmp_path / "bad-json"
    bad_json.mkdir()
    (bad_json / "config.json").write_text("{model_type: llama")
    no_type = tmp_path / "no-type"
    no_type.mkdir()
    (no_type / "config.json").write_text(json.dumps({"hidden_size": 8}))
    no_tokenizer = tmp_path / "no-tokenizer"
    no_tokenizer.mkdir()
    (no_tokenizer / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    return {
        "text": (text, "is a file but not a GGUF model"),
        "no_header": (no_header, "is not a GGUF file"),
        "fake": (fake, "could not be read as a GGUF model"),
        "empty_dir": (empty_dir, "has no config.json"),
        "bad_json": (bad_json, "config.json that is not valid JSON"),
        "no_type": (no_type, "config.json without a model_type"),
        "no_tokenizer": (no_tokenizer, "could not load the model in"),
    }


CASES = ["text", "no_header", "fake", "empty_dir", "bad_json", "no_type", "no_tokenizer"]


@pytest.mark.parametrize("case", CASES)
def test_bad_model_is_one_line_for_eval(tmp_path, case, monkeypatch):
    monkeypatch.setenv("MEDS_CACHE", str(tmp_path / "cache"))
    path, message = bad_models(tmp_path)[case]
    (tmp_path / "data" / "math500").mkdir(parents=True)
    (tmp_path / "data" / "math500" / "test.jsonl").write_text(json.dumps({"problem": "1+1", "answer": "2"}) + "\n")
    line = one_error_line(CliRunner().invoke(app, ["eval", "--model", str(path), "--benchmarks", "math500",
                                                   "--data-dir", str(tmp_path / "data"),
                                                   "--output", str(tmp_path / "out")]))
    assert message in line and str(path) in line
    if case not in ("fake", "no_tokenizer"):  # found without parsing the model: no output folder made
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", CASES)
def test_bad_model_is_one_line_for_train_and_leaves_no_folder(tmp_path, case, monkeypatch):
    monkeypatch.setenv("MEDS_CACHE", str(tmp_path / "cache"))
    path, message = bad_models(tmp_path)[case]
    result = CliRunner().invoke(app, ["train", "--model", str(path), "--task", "copy", "--steps", "1",
                                      "--output", str(tmp_path / "run")])
    assert message in one_error_line(result)
    assert not (tmp_path / "run").exists()


def test_prechecks_need_no_weights(tmp_path):
    models = bad_models(tmp_path)
    for case in ("text", "no_header", "empty_dir", "bad_json", "no_type"):
        with pytest.raises(UserError):
            precheck_model(str(models[case][0]))
    assert precheck_model(str(models["no_tokenizer"][0])) == 64  # its width, read from config.json
    assert precheck_model("tiny-llama") is None and precheck_model("some/hub-id") is None


def test_unknown_dtype(tmp_path):
    line = one_error_line(CliRunner().invoke(app, ["eval", "--model", "tiny-llama", "--dtype", "float8",
                                                   "--output", str(tmp_path / "out")]))
    assert "unknown --dtype 'float8'" in line and "float32, bfloat16, float16, auto" in line
    assert not (tmp_path / "out").exists()
    line = one_error_line(CliRunner().invoke(app, ["train", "--set", "model.dtype=fp32",
                                                   "--output", str(tmp_path / "r")]))
    assert "model.dtype" in line and "fp32" in line and "float32" in line
    with pytest.raises(UserError, match="unknown model.dtype 'half'"):
        load_model_and_tokenizer("tiny-llama", "half")
