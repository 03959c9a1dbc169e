"""The dataset hub's copy of MBPP+ read as an EvalPlus release row.

The release file (MbppPlus.jsonl.gz) has `task_id` 'Mbpp/N', `prompt`, `entry_point`,
`canonical_solution`, `base_input`, `plus_input` and `atol`. The hub copy (evalplus/mbppplus)
has none of the last four: `task_id` is the number N, `code` the canonical solution, `prompt` the
bare task text, `test_list` the original MBPP asserts (one per base input) and `test` a script
that holds every input (`inputs = [...]`, base inputs first) and calls
`assertion(<function>(*inp), exp, <atol>)` on each.

`release_row` rebuilds the release fields from it: the entry point is the function the script
calls (or, failing that, the function of the canonical solution the asserts call), the inputs
are read from the script as literals (never executed here), the first len(test_list) of them
are the base inputs. Where the inputs cannot be read as literals, the row keeps its test script
(`script_test`) and is graded by running it after the solution.
"""

import ast
import math
import re

_LITERAL_NAMES = {"inf": math.inf, "nan": math.nan, "True": True, "False": False, "None": None}


def _literal(node):
    """ast.literal_eval, plus the names inf/nan (`from math import inf`) and float('...')."""
    if isinstance(node, ast.Name) and node.id in _LITERAL_NAMES:
        return _LITERAL_NAMES[node.id]
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "float"
            and len(node.args) == 1 and not node.keywords and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)):  # fmt: skip
        return float(node.args[0].value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _literal(node.operand)
        return -value if isinstance(node.op, ast.USub) else +value
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        items = [_literal(item) for item in node.elts]
        return items if isinstance(node, ast.List) else tuple(items) if isinstance(node, ast.Tuple) else set(items)
    if isinstance(node, ast.Dict):
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("set", "frozenset") \
            and not node.keywords and len(node.args) <= 1:  # fmt: skip
        items = _literal(node.args[0]) if node.args else ()
        return set(items) if node.func.id == "set" else frozenset(items)
    return ast.literal_eval(node)  # constants, complex sums; anything else raises ValueError


def _assigned(tree: ast.Module, name: str):
    for statement in tree.body:
        if isinstance(statement, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name
                                                     for t in statement.targets):
            return statement.value
    return None


def _assertion_call(tree: ast.Module) -> tuple[str, float] | None:
    """(function, atol) of the script's `assertion(<function>(*inp), exp, <atol>)`."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "assertion"
                and len(node.args) == 3 and isinstance(node.args[0], ast.Call)
                and isinstance(node.args[0].func, ast.Name)):  # fmt: skip
            try:
                atol = float(_literal(node.args[2]))
            except (ValueError, TypeError, SyntaxError):
                atol = 0.0
            return node.args[0].func.id, atol
    return None


def _called_and_defined(test_list: list[str], code: str) -> str | None:
    """The first function the asserts call that the canonical solution defines."""
    defined = set(re.findall(r"^def\s+(\w+)\s*\(", code, re.M))
    for line in test_list:
        for name in re.findall(r"(\w+)\s*\(", line):
            if name in defined:
                return name
    return None


def release_row(row: dict) -> dict:
    """A hub-layout MBPP+ row as a release row (already a release row: returned as it is)."""
    if "entry_point" in row and "base_input" in row:
        return row
    code, test, test_list = row["code"], row["test"], list(row["test_list"])
    number = int(str(row["task_id"]).split("/")[-1])
    try:
        tree = ast.parse(test)
    except SyntaxError:
        tree = ast.Module(body=[], type_ignores=[])
    call = _assertion_call(tree)
    entry_point = call[0] if call else _called_and_defined(test_list, code)
    if entry_point is None:
        raise KeyError("entry_point")  # neither the script nor the asserts name the function
    first_assert = test_list[0] if test_list else ""
    release = {
        "task_id": f"Mbpp/{number}",
        "prompt": f'"""\n{row["prompt"]}\n{first_assert}\n"""\n',
        "entry_point": entry_point,
        "canonical_solution": code,
        "atol": call[1] if call else 0.0,
    }
    inputs_node = _assigned(tree, "inputs")
    try:
        inputs = _literal(inputs_node) if inputs_node is not None else None
    except (ValueError, TypeError, SyntaxError, RecursionError):
        inputs = None
    if isinstance(inputs, list) and all(isinstance(args, (list, tuple)) for args in inputs):
        n_base = min(len(test_list), len(inputs))
        release.update(base_input=[list(a) for a in inputs[:n_base]], plus_input=[list(a) for a in inputs[n_base:]])
    else:
        release["script_test"] = "\n".join(list(row.get("test_imports") or []) + [test])
    return release
