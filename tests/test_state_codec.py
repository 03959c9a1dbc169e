"""The checkpoint state codec: bit-exact round trips of every state a checkpoint holds, errors
for what it cannot store, and crafted files refused without running anything."""

import json
import math
import pickle
import random

import numpy as np
import pytest
import torch

from algorithms.meds_memory import Bank, Memory
from meds_cli.core.errors import UserError
from meds_cli.engine.run_folders.state_codec import (
    BadStateFile,
    StateTypeError,
    decode_state,
    encode_state,
    load_state,
    save_state,
    state_files,
)
from tests.hostile import marker_pickle, plant


def round_trip(state, tmp_path, name="state"):
    save_state(state, tmp_path, name)
    return load_state(tmp_path, name)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.dtype == b.dtype and a.shape == b.shape
            and a.reshape(-1).contiguous().view(torch.uint8).tolist()
            == b.reshape(-1).contiguous().view(torch.uint8).tolist())


def assert_identical(a, b, where="state"):
    """Equal values of identical types all the way down; tensors and floats compared bit for bit."""
    assert type(a) is type(b) or (type(a) is torch.nn.Parameter and type(b) is torch.Tensor), (where, type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert same_bits(a, b), where
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), where
    elif isinstance(a, float):
        assert (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b)), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for key in a:
            assert_identical(a[key], b[key], f"{where}/{key!r}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_identical(x, y, f"{where}[{i}]")
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), where
    else:
        assert a == b, where


def trained_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.98))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    for _ in range(3):
        model(torch.randn(5, 4)).pow(2).sum().backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    return model, optimizer, scheduler


def test_optimizer_and_scheduler_round_trip_and_train_on_identically(tmp_path):
    model, optimizer, scheduler = trained_optimizer()
    state = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
    back = round_trip(state, tmp_path)
    assert_identical(state, back)
    assert type(back["optimizer"]["param_groups"][0]["betas"]) is tuple
    assert list(back["optimizer"]["state"]) == [0, 1]  # int keys stay ints

    # A copy restored from the file takes the same next step as the original.
    twin = torch.nn.Linear(4, 3)
    twin.load_state_dict(model.state_dict())
    twin_opt = torch.optim.AdamW(twin.parameters(), lr=1e-2, betas=(0.9, 0.98))
    twin_sched = torch.optim.lr_scheduler.LambdaLR(twin_opt, lambda step: 1.0 / (step + 1))
    twin_opt.load_state_dict(back["optimizer"])
    twin_sched.load_state_dict(back["scheduler"])
    x = torch.randn(5, 4)
    for m, o, s in ((model, optimizer, scheduler), (twin, twin_opt, twin_sched)):
        m(x).pow(2).sum().backward()
        o.step()
        s.step()
    for p, q in zip(model.parameters(), twin.parameters()):
        assert torch.equal(p, q)
    assert scheduler.get_last_lr() == twin_sched.get_last_lr()


def test_rng_states_round_trip_and_replay_the_same_numbers(tmp_path):
    random.seed(3)
    np.random.seed(4)
    torch.manual_seed(5)
    np.random.standard_normal()  # leaves a cached gaussian in numpy's state
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    expected = (random.random(), np.random.standard_normal(3).tolist(), torch.rand(3).tolist())
    back = round_trip(state, tmp_path)
    assert_identical(state, back)
    random.setstate(back["python"])
    np.random.set_state(back["numpy"])
    torch.set_rng_state(back["torch"])
    assert (random.random(), np.random.standard_normal(3).tolist(), torch.rand(3).tolist()) == expected


def test_meds_memory_round_trips(tmp_path):
    memory = Memory()
    features = torch.randn(5, 3)
    memory.put("p1", "wrong", Bank(features[-3:], ["1", None, "3"], ["a", "b…", "c"], [1, 1, 2], [0, -1, 0]))
    memory.put("p1", "correct", Bank.empty(3))
    memory.put("p0", "wrong", Bank(torch.ones(1, 3), ["x"], ["é ✓ \udcff"], [4], []))
    state = {"base": {}, "memory": memory.state_dict(), "layers": [2, 3]}
    back = round_trip(state, tmp_path)
    assert_identical(state, back)
    restored = Memory()
    restored.load_state_dict(back["memory"])
    assert restored.state_dict().keys() == memory.state_dict().keys()
    assert torch.equal(restored.banks["p1"]["wrong"].features, features[-3:])


def test_scalars_and_containers_keep_their_types_and_bits(tmp_path):
    bf16 = torch.tensor([1.5, float("nan"), -0.0], dtype=torch.bfloat16)
    shared = torch.arange(6.0)
    state = {
        "floats": [0.1, -0.0, float("nan"), float("inf"), float("-inf"), 1e-310, 2.0],
        "ints": [0, -1, 2**80, True, False],
        "none": None, "text": "line\nbreak \"quoted\" ✓", "raw": b"\x00\xff",
        "tuple_keys": {(1, "a"): 1, 2: (3.5,), None: [], 1.5: "f", True: "t"},
        "numpy": [np.float32(1.25), np.int64(-7), np.bool_(True), np.arange(6, dtype=">u2").reshape(2, 3),
                  np.zeros((0, 4), dtype=np.float16)],
        "tensors": [bf16, torch.zeros(0, 7), shared[:2], shared[2:], shared.view(2, 3).t(), torch.tensor(3),
                    torch.tensor([True, False]), torch.tensor([1, 2], dtype=torch.uint32),
                    torch.nn.Parameter(torch.ones(2))],
        "nested": [[[{"deep": ({"x": 1},)}]]],
    }
    assert_identical(state, round_trip(state, tmp_path))


def test_a_state_written_twice_gives_the_same_files(tmp_path):
    _, optimizer, _ = trained_optimizer()
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        save_state(optimizer.state_dict(), tmp_path / folder, "s")
    for name in ("s.json", "s.safetensors"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


@pytest.mark.parametrize("value, where", [
    ({"a": {1, 2}}, "/a"),
    ({"memory": {"p": [object()]}}, "/memory/p[0]"),
    ([lambda x: x], "[0]"),
    ({"arr": np.array(["a", "b"])}, "/arr"),
    ({"arr": np.array([None], dtype=object)}, "/arr"),
    ({"sparse": torch.eye(2).to_sparse()}, "/sparse"),
    ({"c": torch.zeros(2, dtype=torch.complex64)}, "/c"),
    ({"size": torch.Size([2])}, "/size"),
])
def test_what_it_cannot_store_is_an_error_at_save_time_and_nothing_is_written(tmp_path, value, where):
    with pytest.raises(StateTypeError) as error:
        save_state(value, tmp_path, "state")
    assert where in str(error.value)
    assert list(tmp_path.iterdir()) == []


def test_crafted_pickle_in_place_of_a_state_file_runs_nothing(tmp_path):
    marker = tmp_path / "executed"
    pickle.loads(marker_pickle(marker))  # the payload is live: unpickling it does create the marker
    assert marker.exists()
    marker.unlink()
    save_state({"x": torch.ones(2)}, tmp_path, "state")
    tree_file, tensor_file = state_files(tmp_path, "state")
    for target in (tree_file, tensor_file):
        save_state({"x": torch.ones(2)}, tmp_path, "state")
        plant(target, marker)
        with pytest.raises(UserError) as error:
            load_state(tmp_path, "state")
        assert str(target) in str(error.value) and "\n" not in str(error.value)
        assert not marker.exists()


def test_a_missing_file_is_one_line(tmp_path):
    save_state({"x": 1}, tmp_path, "state")
    state_files(tmp_path, "state")[1].unlink()
    with pytest.raises(BadStateFile, match="state.safetensors is missing"):
        load_state(tmp_path, "state")


def test_truncated_files_are_refused(tmp_path):
    save_state({"x": torch.arange(100.0)}, tmp_path, "state")
    for path in state_files(tmp_path, "state"):
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        with pytest.raises(BadStateFile) as error:
            load_state(tmp_path, "state")
        assert str(path) in str(error.value)
        path.write_bytes(data)
    assert torch.equal(load_state(tmp_path, "state")["x"], torch.arange(100.0))


@pytest.mark.parametrize("tree", [
    {"object": ["os", "system"]},  # an unknown tag
    {"tensor": "t9", "dtype": "float32", "shape": [2]},  # a tensor that is not in the file
    {"tensor": "t0", "dtype": "float64", "shape": [2]},  # the wrong dtype
    {"tensor": "t0", "dtype": "float32", "shape": [3]},  # the wrong shape
    {"ndarray": "t0", "dtype": "|O", "shape": [1]},  # an object array
    {"map": [1, 2]},
    {"dict": [[{"map": {}}, 1]]},  # an unhashable key
    {"float": "1e5"},
    {"bytes": "zz"},
    [{"tensor": "t0", "dtype": "float32", "shape": [2]}, {"tensor": "t0", "dtype": "float32", "shape": [2]}],
    {"map": {}},  # t0 left over
])
def test_malformed_trees_are_refused(tree):
    with pytest.raises(BadStateFile):
        decode_state(tree, {"t0": torch.ones(2)}, "crafted.json")


def test_a_json_file_that_is_not_ours_is_refused(tmp_path):
    save_state({"x": 1}, tmp_path, "state")
    tree_file = state_files(tmp_path, "state")[0]
    for text in ('{"tree": 1}', '[1, 2]', '{"format": "meds-state", "version": 99, "tree": 1}',
                 '{"format": "meds-state", "version": 1, "tree": NaN}', "[" * 100_000):
        tree_file.write_text(text)
        with pytest.raises(BadStateFile):
            load_state(tmp_path, "state")


def test_the_tree_is_plain_json_a_person_can_read(tmp_path):
    save_state({"step": 3, "lr": [0.5], "betas": (0.9, 0.99)}, tmp_path, "state")
    document = json.loads(state_files(tmp_path, "state")[0].read_text())
    assert document["tree"] == {"map": {"step": 3, "lr": [0.5], "betas": {"tuple": [0.9, 0.99]}}}


def test_encode_is_pure():
    tree, tensors = encode_state({"w": torch.ones(2), "n": 1})
    assert tree == {"map": {"w": {"tensor": "t0", "dtype": "float32", "shape": [2]}, "n": 1}}
    assert list(tensors) == ["t0"]
