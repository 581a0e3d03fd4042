"""The command line as a user meets it, run as a subprocess: arguments and settings that used to end in a traceback
(a seed out of range, more bootstrap replicates than memory holds, an allocation that fails, an unknown engine in
``TORCH_LWLRAP_ENGINE``) end with one line on stderr and exit status 2; the first run in an environment says that it
compiles the CPU kernels, a later one does not; ``doctor`` prints its lines as it measures them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torch_lwlrap.cli._environment import COMPILE_NOTICE

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "examples" / "data"
TRUTH, PRED, PRED_B = (str(DATA / name) for name in ("sample_truth.csv", "sample_submission.csv",
                                                     "sample_submission_b.csv"))


def run_cli(*argv, env=None, timeout=600):
    environ = dict(os.environ)
    environ.pop("TORCH_LWLRAP_ENGINE", None)
    environ.update(env or {})
    return subprocess.run([sys.executable, "-m", "torch_lwlrap", *map(str, argv)], capture_output=True, text=True,
                          cwd=REPO, env=environ, timeout=timeout)


def check_one_line_error(done, words, command=None):
    """One line on stderr, exit status 2; an option's error (``command``: its subcommand) in argparse's usage form,
    named by the subcommand, with its ``--help`` to read."""
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    prog = "torch-lwlrap" if command is None else f"torch-lwlrap {command}"
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    if command is not None:
        assert lines[0].endswith(f" (see {prog} --help)"), lines[0]
    for word in words:
        assert word in lines[0], (word, lines[0])


# ---------------------------------------------------------------------------------------------------------------
# Arguments and settings


ERRORS = {
    "score seed -1": (["score", TRUTH, PRED, "--ci", "20", "--seed", "-1"], ["--seed", "0 to 2**63 - 1", "not -1"]),
    "compare seed -1": (["compare", TRUTH, PRED, PRED_B, "--seed", "-1"], ["--seed", "not -1"]),
    "compare seed 2**63": (
        ["compare", TRUTH, PRED, PRED_B, "--seed", str(2**63)], ["--seed", "9223372036854775807", str(2**63)]
    ),
    "score seed without --ci": (["score", TRUTH, PRED, "--seed", "3"], ["--seed sets the bootstrap interval", "--ci"]),
    "score level without --ci": (
        ["score", TRUTH, PRED, "--level", "1.5", "--seed", "-1"], ["--level and --seed set", "add --ci"]
    ),
    # 20 classes: 10**15 replicates need about 850 PiB, 10**13 about 11 PiB for two systems
    "score --ci too large": (["score", TRUTH, PRED, "--ci", str(10**15)], ["--ci 1000000000000000", "PiB", "memory"]),
    "compare --bootstrap too large": (
        ["compare", TRUTH, PRED, PRED_B, "--bootstrap", str(10**13)], ["--bootstrap 10000000000000", "PiB", "memory"]
    ),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_bad_arguments_exit_2_with_one_line(case):
    argv, words = ERRORS[case]
    check_one_line_error(run_cli(*argv), words, command=argv[0])


def test_the_seed_bounds_are_accepted():
    done = run_cli("score", TRUTH, PRED, "--ci", "20", "--seed", str(2**63 - 1), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ci"]["seed"] == 2**63 - 1


@pytest.mark.parametrize("command", [["score", TRUTH, PRED], ["doctor"]])
def test_an_unknown_engine_in_the_environment_exits_2_with_one_line(command):
    done = run_cli(*command, env={"TORCH_LWLRAP_ENGINE": "bogus"})
    check_one_line_error(done, ["TORCH_LWLRAP_ENGINE", "'bogus'", "auto, sort, count, numba"])


def test_the_engine_is_checked_before_the_files_are_read(tmp_path):
    done = run_cli("score", tmp_path / "missing.csv", PRED, env={"TORCH_LWLRAP_ENGINE": "bogus"})
    check_one_line_error(done, ["TORCH_LWLRAP_ENGINE"])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc/self/status are Linux's")
def test_an_allocation_that_fails_exits_2_with_one_line():
    # The memory check lets 2,000,000 replicates of 20 classes through (about 2 GB), but the process may grow by
    # only 256 MiB more: the allocation itself fails.
    code = (
        "import os, resource, sys\n"
        "from torch_lwlrap.cli import main\n"
        "sys.stdout = open(os.devnull, 'w')\n"
        f"assert main(['score', {TRUTH!r}, {PRED!r}, '--ci', '50', '--json']) == 0\n"  # torch, numba, threads
        "size = int(next(l for l in open('/proc/self/status') if l.startswith('VmSize')).split()[1]) * 1024\n"
        "resource.setrlimit(resource.RLIMIT_AS, (size + (256 << 20), resource.RLIM_INFINITY))\n"
        f"sys.exit(main(['score', {TRUTH!r}, {PRED!r}, '--ci', '2000000']))\n"
    )
    from torch_lwlrap.cli._environment import available_memory

    if (available_memory() or 0) < 4 << 30:
        pytest.skip("needs 4 GiB available, so that the memory check lets the run through")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=600)
    check_one_line_error(done, ["out of memory", "could not allocate", "--ci 2000000"])


# ---------------------------------------------------------------------------------------------------------------
# The first run in an environment


@pytest.mark.slow
def test_the_compile_notice_appears_once_with_an_empty_cache_and_not_with_a_warm_one(tmp_path):
    pytest.importorskip("numba")
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "numba-cache")}
    cold = run_cli("score", TRUTH, PRED, "--json", env=env)
    assert cold.returncode == 0, cold.stderr
    assert cold.stderr.splitlines() == [COMPILE_NOTICE]
    assert json.loads(cold.stdout)["num_samples"] == 300  # stdout is the JSON object alone
    warm = run_cli("score", TRUTH, PRED, "--json", env=env)
    assert (warm.returncode, warm.stderr) == (0, "")
    assert json.loads(warm.stdout) == json.loads(cold.stdout)


@pytest.mark.slow
def test_doctor_prints_each_line_as_it_is_measured():
    process = subprocess.Popen([sys.executable, "-m", "torch_lwlrap", "doctor"], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, cwd=REPO)
    try:
        lines, arrivals = [], []
        while not lines or not lines[-1].startswith("cpu "):
            line = process.stdout.readline()
            assert line, f"doctor ended before its first check line: {lines}"
            lines.append(line)
            arrivals.append(time.monotonic())
        assert lines[0] == "torch-lwlrap doctor\n"
        assert any(line.startswith("torch ") for line in lines)
        assert lines[-1].split()[:2] == ["cpu", "float16"]
        # The versions came out before the first check was measured (seconds of agreement cases and timings),
        # and the other dtypes and the summary are still to come.
        assert arrivals[-1] - arrivals[0] > 0.5
        assert process.poll() is None
    finally:
        process.kill()
        process.wait()
        process.stdout.close()


def test_library_warnings_are_one_line_each_and_the_run_goes_on():
    # Too few replicates for a 95% interval: said once (score ranks the overall and the per-class interval), in the
    # errors' form, and the report is still printed with the interval of those replicates.
    done = run_cli("score", TRUTH, PRED, "--ci", "10", "--json")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "compil" not in line]  # a first run's compile notice
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("torch-lwlrap: warning: A 0.95 percentile interval from 10 bootstrap replicate(s)")
    assert "at least 40 replicates" in lines[0]
    report = json.loads(done.stdout)
    low, high = report["ci"]["lwlrap"]
    assert report["ci"]["num_bootstrap"] == 10 and low <= report["lwlrap"] <= high


def test_class_names_the_terminal_cannot_show_are_escaped_not_a_traceback(tmp_path):
    """On Windows, output redirected to a file or a pipe takes the locale's code page (cp1252): a class name in
    Japanese had ended the report in a UnicodeEncodeError traceback, exit status 1."""
    (tmp_path / "truth.csv").write_text("fname,labels\na.wav,日本語\nb.wav,Bark\n", encoding="utf-8")
    (tmp_path / "pred.csv").write_text("fname,日本語,Bark\na.wav,0.9,0.1\nb.wav,0.2,0.7\n", encoding="utf-8")
    done = run_cli("score", tmp_path / "truth.csv", tmp_path / "pred.csv", "--per-class",
                   env={"PYTHONIOENCODING": "cp1252"})
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    # the escapes take 18 columns: the other rows' numbers line up with theirs
    rows = done.stdout.split("per-class lwlrap, worst first:\n", 1)[1].splitlines()[1:3]
    assert sorted(row.split()[0] for row in rows) == ["Bark", "\\u65e5\\u672c\\u8a9e"], rows
    assert [row.index("1.000000") for row in rows] == [18 + 2] * 2, rows
    assert "lwlrap       1.000000" in done.stdout
