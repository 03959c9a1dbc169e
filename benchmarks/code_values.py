"""The wire format of values between the sandboxed harness and the grader.

A program's outputs (and the test inputs going the other way) cross the process boundary as
JSON in a tagged form (`encode_value` / `decode_value`) that keeps apart what JSON would merge:
tuples and lists, sets, dicts with any keys, complex numbers, bytes, big ints, and numpy
scalars and arrays with their dtype. Types matter to the grade: EvalPlus fails a numpy array
where a list is expected and an np.float64 where an approximate float comparison needs a float,
so the decoded value must be of the type the program returned, not a normalised one.

An output too big to send back whole travels as a digest of its *equality form*
(`equality_form`): a canonical JSON text that two values share exactly when Python's `==`
holds between them (1 == 1.0 == True, a set equals a frozenset, dict and set order ignored,
a list never equals a tuple). A value holding NaN or a type with no such form has none
(NaN equals nothing): its digest is `None` and it equals nothing either.

`encode_value`, `decode_value`, `equality_form` and `digest` are also pasted into the harness
program (see code_harness), so they use nothing but builtins, each other and a local
`import numpy` where a numpy value is met.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Opaque:
    """An output of a type the codec does not know (kept as its type name and repr), or the
    digest of an output too big to send (type_name 'digest', text the digest)."""

    type_name: str
    text: str


class Unequal:
    """A value that equals nothing, itself included: an output too big to send that has no
    equality form (NaN inside, or an unknown type)."""

    def __eq__(self, other):
        return False

    def __ne__(self, other):
        return True

    __hash__ = None

    def __repr__(self):
        return "Unequal()"


_NUMPY_KINDS = "biufcUSO"  # dtype kinds whose items tolist() turns into Python values


def encode_value(value):
    """JSON-able form of value: lists stay lists, other containers and non-JSON scalars
    become {"$": tag, "v": payload}."""
    if type(value).__module__ == "numpy":
        import numpy

        if isinstance(value, numpy.ndarray) and value.dtype.kind in _NUMPY_KINDS:
            items = [encode_value(item) for item in value.ravel().tolist()]
            return {"$": "ndarray", "d": value.dtype.str, "s": list(value.shape), "v": items}
        if isinstance(value, numpy.generic) and value.dtype.kind in _NUMPY_KINDS:
            return {"$": "numpy", "d": value.dtype.str, "v": encode_value(value.item())}
        return {"$": "repr", "t": type(value).__name__, "v": repr(value)[:10000]}
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        # json writes ints in decimal, which Python refuses past 4300 digits: use hex there.
        return int(value) if value.bit_length() < 4000 else {"$": "int", "v": hex(value)}
    if isinstance(value, float):
        return float(value)
    if isinstance(value, list):
        return [encode_value(item) for item in value]
    if isinstance(value, tuple):
        return {"$": "tuple", "v": [encode_value(item) for item in value]}
    if isinstance(value, dict):
        return {"$": "dict", "v": [[encode_value(k), encode_value(v)] for k, v in value.items()]}
    if isinstance(value, (set, frozenset)):
        tag = "set" if isinstance(value, set) else "frozenset"
        return {"$": tag, "v": [encode_value(item) for item in value]}
    if isinstance(value, complex):
        return {"$": "complex", "v": [value.real, value.imag]}
    if isinstance(value, (bytes, bytearray)):
        return {"$": "bytes", "v": bytes(value).hex()}
    return {"$": "repr", "t": type(value).__name__, "v": repr(value)[:10000]}


def decode_value(data):
    """The value encode_value encoded; unknown types come back as Opaque."""
    if isinstance(data, list):
        return [decode_value(item) for item in data]
    if not isinstance(data, dict):
        return data
    tag, payload = data["$"], data["v"]
    if tag == "tuple":
        return tuple(decode_value(item) for item in payload)
    if tag == "dict":
        return {decode_value(k): decode_value(v) for k, v in payload}
    if tag == "set":
        return {decode_value(item) for item in payload}
    if tag == "frozenset":
        return frozenset(decode_value(item) for item in payload)
    if tag == "complex":
        return complex(*payload)
    if tag == "bytes":
        return bytes.fromhex(payload)
    if tag == "int":
        return int(payload, 16)
    if tag in ("numpy", "ndarray"):
        import numpy

        dtype = numpy.dtype(data["d"])
        if tag == "numpy":
            return dtype.type(decode_value(payload))
        items = [decode_value(item) for item in payload]
        if dtype.kind == "O":  # item by item: numpy would read nested lists as more dimensions
            array = numpy.empty(len(items), dtype=dtype)
            for index, item in enumerate(items):
                array[index] = item
        else:
            array = numpy.array(items, dtype=dtype)
        return array.reshape(data["s"])
    if tag == "digest":
        # Equal only to an output with the same digest; none: equal to nothing.
        return Opaque("digest", payload) if payload else Unequal()
    return Opaque(data.get("t", "?"), payload)


def equality_form(value):
    """A JSON-able form shared by two values exactly when == holds between them, for the
    builtin types; None where the value has none (NaN, numpy arrays, unknown types)."""
    import math

    def form(item):
        if type(item).__module__ == "numpy":
            import numpy

            if not isinstance(item, numpy.generic):
                raise ValueError  # an array: == is elementwise, not a truth value
            item = item.item()
        if item is None or isinstance(item, str):
            return item
        if isinstance(item, (bool, int)):
            return int(item)
        if isinstance(item, float):
            if math.isnan(item):
                raise ValueError  # NaN equals nothing
            return int(item) if item.is_integer() else item  # 2.0 == 2; inf stays a float
        if isinstance(item, complex):
            return form(item.real) if item.imag == 0 else ["complex", form(item.real), form(item.imag)]
        if isinstance(item, list):
            return ["list"] + [form(x) for x in item]
        if isinstance(item, tuple):
            return ["tuple"] + [form(x) for x in item]
        if isinstance(item, (set, frozenset)):
            return ["set"] + sorted((form(x) for x in item), key=_json_text)
        if isinstance(item, dict):
            return ["dict"] + sorted(([form(k), form(v)] for k, v in item.items()), key=_json_text)
        if isinstance(item, (bytes, bytearray)):
            return ["bytes", bytes(item).hex()]
        raise ValueError  # a type whose == we cannot mirror

    try:
        return form(value)
    except (ValueError, RecursionError, OverflowError):
        return None


def _json_text(data) -> str:
    import json

    return json.dumps(data)


def digest(value):
    """SHA-256 of value's equality form, or None where it has none."""
    import hashlib

    form = equality_form(value)
    return None if form is None else hashlib.sha256(_json_text(form).encode()).hexdigest()
