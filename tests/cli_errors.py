"""A command that refuses its input: exit code 2 and one line, `error: ...`, with no traceback."""


def one_error_line(result) -> str:
    """The one line a CliRunner result printed, checked to be a refusal and nothing else."""
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in result.output, result.output
    return lines[0]
