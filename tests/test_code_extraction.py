"""Choosing the program in a model response."""

from benchmarks.code_extraction import defines, extract_code, fenced_blocks

SOLUTION = "def add(a, b):\n    return a + b\n"
USAGE = "print(add(1, 2))\n"


def fence(body: str, tag: str = "python") -> str:
    return f"```{tag}\n{body}```\n"


def test_python_fence_is_extracted():
    assert extract_code("Here you go:\n" + fence(SOLUTION) + "Done.") == SOLUTION


def test_bare_fence_is_extracted():
    assert extract_code(fence(SOLUTION, tag="")) == SOLUTION


def test_block_defining_the_entry_point_wins_over_a_longer_one():
    longer_example = "# a long usage example\n" * 5 + USAGE
    response = fence(SOLUTION) + "Example:\n" + fence(longer_example)
    assert extract_code(response, entry_point="add") == SOLUTION


def test_last_block_defining_the_entry_point_wins():
    fixed = "def add(a, b):\n    return b + a  # fixed\n"
    response = fence(SOLUTION) + "Wait, a fix:\n" + fence(fixed)
    assert extract_code(response, entry_point="add") == fixed


def test_without_entry_point_the_longest_block_wins():
    assert extract_code(fence(USAGE) + fence(SOLUTION)) == SOLUTION


def test_equal_lengths_pick_the_last():
    assert extract_code(fence("x = 1\n") + fence("y = 2\n")) == "y = 2\n"


def test_other_languages_are_ignored_when_python_exists():
    response = fence("pip install numpy\n", tag="bash") + fence(SOLUTION)
    assert extract_code(response, entry_point="add") == SOLUTION


def test_mistagged_block_defining_the_function_counts():
    assert extract_code(fence(SOLUTION, tag="text"), entry_point="add") == SOLUTION


def test_truncated_response_keeps_the_open_block():
    assert extract_code("```python\ndef add(a, b):\n    return a") == "def add(a, b):\n    return a"


def test_raw_text_that_parses_is_the_code():
    assert extract_code(SOLUTION) == SOLUTION


def test_prose_without_code_gives_none():
    assert extract_code("I am not sure how to solve this.") is None
    assert extract_code("") is None


def test_fences_with_info_string_and_indentation():
    response = "  ```python title=sol.py\n" + SOLUTION + "  ```\n"
    assert fenced_blocks(response) == [("python", SOLUTION)]


def test_defines_sees_methods_and_async_but_not_calls():
    assert defines("class S:\n    def add(self, a):\n        pass\n", "add")
    assert defines("async def add(a):\n    pass\n", "add")
    assert not defines("print(add(1, 2))\n", "add")
    assert not defines("def addition(a):\n    pass\n", "add")
