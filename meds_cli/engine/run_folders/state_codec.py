"""Checkpoint state as data: safetensors for tensors and arrays, JSON for structure and scalars.

Optimizer and scheduler state, RNG states and algorithm state (the MEDS memory, ...) are
nested Python values. Pickling them would make a checkpoint code: a crafted file in a run
folder would run on resume. Here a state is written as two files, `NAME.json` (the tree) and
`NAME.safetensors` (its tensors and numpy arrays), and read back by parsing only: nothing is
unpickled, and what does not parse is refused with one line.

What a state may hold: None, bool, int, float (NaN and infinities too), str, bytes, list,
tuple, dict (any keys made of these), torch tensors (dense, any dtype safetensors stores; read
back on the CPU) and numpy arrays and scalars of numeric dtypes. Everything round-trips bit for
bit, types included (a tuple stays a tuple, an int key stays an int). Anything else is a
StateTypeError when saving, naming where in the state it sits, never a silent pickle.

The tree in JSON: lists are JSON arrays, None/bool/int/str and finite floats are themselves,
and every other value is an object with one tag key:
  {"map": {str: node}}            dict whose keys are all strings
  {"dict": [[key, value], ...]}   any other dict
  {"tuple": [node, ...]}
  {"float": "nan" | "inf" | "-inf"}
  {"bytes": hex}
  {"tensor": name, "dtype": "float32", "shape": [...]}
  {"ndarray": name, "dtype": "<u4", "shape": [...]}   stored as its raw bytes (uint8)
  {"npscalar": "<f8", "hex": raw bytes}
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from meds_cli.core.errors import UserError

FORMAT = "meds-state"
VERSION = 1
TAGS = ("map", "dict", "tuple", "float", "bytes", "tensor", "ndarray", "npscalar")
# Torch dtypes by name, as written in the tree (safetensors stores them all).
TORCH_DTYPES = {str(dtype).removeprefix("torch."): dtype for dtype in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool, torch.uint16, torch.uint32, torch.uint64,
    torch.float8_e4m3fn, torch.float8_e5m2)}


class StateTypeError(TypeError):
    """A state holds a value this format cannot store (a bug in whoever built the state)."""


class BadStateFile(UserError):
    """A state file that is not what this module writes: truncated, edited, or not ours at all."""


def state_files(folder: Path, name: str) -> tuple[Path, Path]:
    """(tree file, tensor file) of state `name` in `folder`."""
    return Path(folder) / f"{name}.json", Path(folder) / f"{name}.safetensors"


# ---------------------------------------------------------------- encoding


class _Encoder:
    def __init__(self):
        self.tensors: dict[str, torch.Tensor] = {}
        self._storages: set[tuple[str, int]] = set()

    def _add(self, tensor: torch.Tensor) -> str:
        tensor = tensor.detach().cpu()
        # safetensors refuses two tensors over one storage, and views that are not packed.
        storage = (str(tensor.device), tensor.untyped_storage().data_ptr())
        if storage in self._storages or not tensor.is_contiguous():
            tensor = tensor.contiguous().clone()
        elif tensor.numel():
            self._storages.add(storage)
        name = f"t{len(self.tensors)}"
        self.tensors[name] = tensor
        return name

    def encode(self, value: Any, where: str) -> Any:
        kind = type(value)
        if value is None or kind in (bool, int, str):
            return value
        if kind is float:
            return value if math.isfinite(value) else {"float": repr(value)}
        if kind is list:
            return [self.encode(v, f"{where}[{i}]") for i, v in enumerate(value)]
        if kind is tuple:
            return {"tuple": [self.encode(v, f"{where}[{i}]") for i, v in enumerate(value)]}
        if kind is dict:
            if all(type(k) is str for k in value):
                return {"map": {k: self.encode(v, f"{where}/{k}") for k, v in value.items()}}
            return {"dict": [[self.encode(k, f"{where} key {k!r}"), self.encode(v, f"{where}/{k!r}")]
                             for k, v in value.items()]}
        if kind is bytes:
            return {"bytes": value.hex()}
        if kind in (torch.Tensor, torch.nn.Parameter):
            return self._tensor(value, where)
        if kind is np.ndarray:
            return self._ndarray(value, where)
        if isinstance(value, np.generic) and value.dtype.kind in "biufc":
            return {"npscalar": value.dtype.str, "hex": value.tobytes().hex()}
        raise StateTypeError(f"cannot store {where or 'the state'}: a {kind.__module__}.{kind.__qualname__} "
                             "(a state holds None, bool, int, float, str, bytes, list, tuple, dict, tensors, "
                             "numpy arrays)")

    def _tensor(self, value: torch.Tensor, where: str) -> dict:
        dtype = str(value.dtype).removeprefix("torch.")
        if value.layout != torch.strided or value.is_quantized or value.is_meta or dtype not in TORCH_DTYPES:
            raise StateTypeError(f"cannot store {where}: a {value.layout} {value.dtype} tensor on {value.device} "
                                 f"(dense tensors of {', '.join(TORCH_DTYPES)} only)")
        return {"tensor": self._add(value), "dtype": dtype, "shape": list(value.shape)}

    def _ndarray(self, value: np.ndarray, where: str) -> dict:
        if value.dtype.kind not in "biufc":
            raise StateTypeError(f"cannot store {where}: a numpy array of dtype {value.dtype} (numeric dtypes only)")
        raw = np.frombuffer(np.ascontiguousarray(value).tobytes(), dtype=np.uint8).copy()
        return {"ndarray": self._add(torch.from_numpy(raw)), "dtype": value.dtype.str, "shape": list(value.shape)}


def encode_state(state: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """(JSON-ready tree, tensors by name) of a state; StateTypeError on a value it cannot store."""
    encoder = _Encoder()
    tree = encoder.encode(state, "")
    return tree, encoder.tensors


# ---------------------------------------------------------------- decoding


class _Decoder:
    def __init__(self, tensors: dict[str, torch.Tensor], source: str):
        self.tensors, self.source = tensors, source
        self.used: set[str] = set()

    def bad(self, why: str) -> BadStateFile:
        return BadStateFile(f"{self.source} is not a valid meds state file ({why}); it was damaged or "
                            f"replaced, so nothing was loaded from it")

    def decode(self, node: Any) -> Any:
        if node is None or type(node) in (bool, int, str, float):
            return node
        if type(node) is list:
            return [self.decode(v) for v in node]
        if type(node) is not dict or not node:
            raise self.bad(f"unexpected {type(node).__name__} in the tree")
        tag = next(iter(node))
        if tag not in TAGS:
            raise self.bad(f"unknown entry '{str(tag)[:40]}'")
        body = node[tag]
        if tag == "map" and type(body) is dict:
            return {k: self.decode(v) for k, v in body.items()}
        if tag == "dict" and type(body) is list and all(type(p) is list and len(p) == 2 for p in body):
            return {self._key(k): self.decode(v) for k, v in body}
        if tag == "tuple" and type(body) is list:
            return tuple(self.decode(v) for v in body)
        if tag == "float" and body in ("nan", "inf", "-inf"):
            return float(body)
        if tag == "bytes" and type(body) is str:
            return self._hex(body)
        if tag == "tensor":
            return self._tensor(node)
        if tag == "ndarray":
            return self._ndarray(node)
        if tag == "npscalar":
            dtype = self._np_dtype(body)
            raw = self._hex(node.get("hex"))
            if len(raw) != dtype.itemsize:
                raise self.bad(f"a numpy {dtype} scalar of {len(raw)} bytes")
            return np.frombuffer(raw, dtype=dtype)[0]
        raise self.bad(f"malformed '{tag}' entry")

    def _key(self, node: Any):
        key = self.decode(node)
        try:
            hash(key)
        except TypeError:
            raise self.bad(f"an unhashable dict key of type {type(key).__name__}") from None
        return key

    def _hex(self, text: Any) -> bytes:
        try:
            return bytes.fromhex(text)
        except (TypeError, ValueError):
            raise self.bad("bytes that are not hex") from None

    def _np_dtype(self, text: Any) -> np.dtype:
        try:
            dtype = np.dtype(text) if type(text) is str else None
        except TypeError:
            dtype = None
        if dtype is None or dtype.kind not in "biufc":
            raise self.bad(f"numpy dtype {str(text)[:20]!r}")
        return dtype

    def _stored(self, node: dict, key: str) -> torch.Tensor:
        name = node.get(key)
        if type(name) is not str or name not in self.tensors:
            raise self.bad(f"tensor {str(name)[:40]!r} is missing from its .safetensors file")
        if name in self.used:
            raise self.bad(f"tensor {name!r} is used twice")
        self.used.add(name)
        return self.tensors[name]

    def _shape(self, node: dict) -> list[int]:
        shape = node.get("shape")
        if type(shape) is not list or not all(type(d) is int and d >= 0 for d in shape):
            raise self.bad(f"shape {str(shape)[:40]}")
        return shape

    def _tensor(self, node: dict) -> torch.Tensor:
        tensor = self._stored(node, "tensor")
        if node.get("dtype") not in TORCH_DTYPES or TORCH_DTYPES[node["dtype"]] != tensor.dtype:
            raise self.bad(f"tensor {node['tensor']!r} is {tensor.dtype}, the tree says {str(node.get('dtype'))[:20]}")
        if list(tensor.shape) != self._shape(node):
            raise self.bad(f"tensor {node['tensor']!r} has shape {list(tensor.shape)}, the tree says {node['shape']}")
        return tensor

    def _ndarray(self, node: dict) -> np.ndarray:
        raw = self._stored(node, "ndarray")
        dtype, shape = self._np_dtype(node.get("dtype")), self._shape(node)
        if raw.dtype != torch.uint8 or raw.dim() != 1 or raw.numel() != dtype.itemsize * math.prod(shape):
            raise self.bad(f"array {node['ndarray']!r} does not hold {shape} values of {dtype}")
        return np.frombuffer(raw.numpy().tobytes(), dtype=dtype).reshape(shape).copy()


def decode_state(tree: Any, tensors: dict[str, torch.Tensor], source: str = "state") -> Any:
    """The state `encode_state` encoded; BadStateFile (a UserError) on anything malformed."""
    decoder = _Decoder(tensors, source)
    try:
        state = decoder.decode(tree)
    except RecursionError:
        raise decoder.bad("nested too deeply") from None
    unused = set(tensors) - decoder.used
    if unused:
        raise decoder.bad(f"tensor {sorted(unused)[0]!r} is not part of the tree")
    return state


# ---------------------------------------------------------------- files


def save_state(state: Any, folder: Path, name: str) -> list[Path]:
    """Write `state` as folder/NAME.json and folder/NAME.safetensors; returns both paths.
    Nothing is written when the state holds a value the format cannot store."""
    from safetensors.torch import save_file

    tree, tensors = encode_state(state)
    tree_file, tensor_file = state_files(folder, name)
    document = {"format": FORMAT, "version": VERSION, "tensors": tensor_file.name, "tree": tree}
    text = json.dumps(document, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    save_file(tensors, str(tensor_file))
    tree_file.write_text(text + "\n", encoding="ascii")
    return [tree_file, tensor_file]


def load_state(folder: Path, name: str) -> Any:
    """The state saved by save_state(state, folder, name), read without unpickling anything.
    A missing, damaged or foreign file is a BadStateFile (one line, nothing loaded)."""
    tree_file, tensor_file = state_files(folder, name)
    for path in (tree_file, tensor_file):
        if not path.is_file():
            raise BadStateFile(f"{path} is missing")
    try:
        document = json.loads(tree_file.read_bytes().decode("ascii"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError) as error:
        raise BadStateFile(f"{tree_file} is not a valid meds state file (not JSON: {_first_line(error)}); "
                           f"it was damaged or replaced, so nothing was loaded from it") from None
    except RecursionError:
        raise BadStateFile(f"{tree_file} is not a valid meds state file (nested too deeply)") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT or "tree" not in document:
        raise BadStateFile(f"{tree_file} is not a meds state file (no '{FORMAT}' header)")
    if document.get("version") != VERSION:
        raise BadStateFile(f"{tree_file} has state format version {document.get('version')!r}; "
                           f"this meds reads version {VERSION}")
    return decode_state(document["tree"], read_tensors(tensor_file), str(tree_file))


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file on the CPU; anything else is a BadStateFile (one line)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not Path(path).is_file():
        raise BadStateFile(f"{path} is missing")
    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, ValueError, RuntimeError, OverflowError, OSError) as error:
        raise BadStateFile(f"{path} is not a valid safetensors file ({_first_line(error)}); it was damaged or "
                           f"replaced, so nothing was loaded from it") from None


def _no_constant(name: str):
    raise ValueError(f"bare {name}")  # NaN/Infinity are written as tagged nodes, never bare


def _first_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return text[0][:120] if text else type(error).__name__
