"""The README's Python snippets run, and the values their comments promise are the values they print."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_python_blocks(index):
    block = BLOCKS[index]
    if "lightning" in block:
        pytest.importorskip("lightning")
    namespace: dict = {}
    exec(compile(block, f"README block {index}", "exec"), namespace)
    checked = 0
    for line in block.splitlines():
        code, _, comment = line.partition("#")
        promised = re.match(r"\s*(tensor\(.*\))\s*$", comment)
        if promised and not line.startswith(" ") and not re.match(r"\s*\w+\s*=[^=]", code):
            value = eval(code, namespace)
            expected = eval(promised.group(1), {"tensor": torch.tensor, "torch": torch})
            torch.testing.assert_close(value, expected.to(value.dtype), atol=5e-5, rtol=0)
            checked += 1
    if "tensor(" in block:
        assert checked, "a README block promises values but none was checked"


def test_readme_has_both_setup_commands():
    text = README.read_text()
    for tag in ("example", "test"):
        assert f"<!-- setup:{tag} -->\n```bash\n" in text


def test_readme_command_line_output_is_current(capsys, monkeypatch):
    from torch_lwlrap.cli import main

    text = README.read_text()
    shown = re.search(r"## Command line.*?```text\n(.*?)```", text, flags=re.S).group(1)
    monkeypatch.chdir(README.parent)
    assert main(["score", "examples/data/sample_truth.csv", "examples/data/sample_submission.csv", "--per-class"]) == 0
    assert capsys.readouterr().out == shown


def test_readme_challenge_files_command_runs(tmp_path, capsys, monkeypatch):
    """The command of "Scoring the challenge's own files", on files of the layouts it names."""
    import shlex

    import numpy as np

    from torch_lwlrap.cli import main

    section = re.search(r"### Scoring the challenge's own files\n(.*?)\n## ", README.read_text(), flags=re.S).group(1)
    command = re.search(r"```bash\n(torch-lwlrap score .*?)\n```", section).group(1)
    argv = shlex.split(command)
    rng = np.random.default_rng(0)
    classes = [f"Class_{j:02d}_(x)" for j in range(30)]
    fnames = [f"{i:06x}.wav" for i in range(50)]
    usage = ["Public" if i % 3 else "Private" for i in range(50)]
    monkeypatch.chdir(tmp_path)
    with open("test_post_competition.csv", "w") as handle:
        handle.write("fname,labels,usage,freesound_id,license\n")
        for i, fname in enumerate(fnames):
            labels = ",".join(classes[j] for j in rng.choice(30, size=2, replace=False))
            handle.write(f'{fname},"{labels}",{usage[i]},{1000 + i},CC-BY\n')
    with open("public_submission.csv", "w") as handle:
        handle.write("fname," + ",".join(classes) + "\n")
        for i, fname in enumerate(fnames):
            if usage[i] == "Public":
                handle.write(fname + "," + ",".join(f"{v:.3f}" for v in rng.random(30)) + "\n")
    with open("vocabulary.csv", "w") as handle:
        handle.writelines(f"{j},{name},/m/0{j}\n" for j, name in enumerate(classes))
    assert argv[0] == "torch-lwlrap"
    assert main(argv[1:]) == 0
    out = capsys.readouterr().out
    assert f"where        usage=Public: {usage.count('Public')} of 50 truth rows" in out
    assert "the 10 worst of" in out


def _paste(block):
    """Feed ``block`` line by line to the interactive interpreter, as a paste into `python` does (a statement after
    an indented block needs a blank line first). Returns what the prompt echoed and what it wrote as errors."""
    import code
    import contextlib
    import io

    errors = []

    class Console(code.InteractiveConsole):
        def write(self, data):
            errors.append(data)

    console, echoed = Console(), io.StringIO()
    with contextlib.redirect_stdout(echoed):
        for line in block.splitlines():
            console.push(line)
            assert not errors, f"pasting {line!r}: " + "".join(errors)
        console.push("")
    assert not errors, "".join(errors)
    return echoed.getvalue().splitlines()


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_python_blocks_paste_into_the_python_prompt(index):
    # Every block pastes as is into the `python` prompt, and what the prompt echoes for a line whose comment
    # promises a tensor is that tensor, written as the comment writes it (dtype included).
    block = BLOCKS[index]
    if "lightning" in block:
        pytest.importorskip("lightning")
    echoed = _paste(block)
    promised = [comment.strip() for line in block.splitlines() if not line.startswith(" ")
                for code_part, _, comment in [line.partition("#")]
                if comment.strip().startswith("tensor(") and not re.match(r"\s*\w+\s*=[^=]", code_part)]
    assert [line for line in echoed if line.startswith("tensor(")] == promised


def test_quickstart_pastes_into_the_python_prompt():
    quickstart = re.search(r"## Quickstart\n.*?```python\n(.*?)```", README.read_text(), flags=re.S).group(1)
    echoed = _paste(quickstart)
    promised = [comment.strip() for line in quickstart.splitlines() if not line.startswith(" ")
                for code_part, _, comment in [line.partition("#")] if comment.strip().startswith("tensor(")]
    assert len(promised) == 4
    assert echoed == promised
