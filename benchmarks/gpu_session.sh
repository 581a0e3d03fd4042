#!/usr/bin/env bash
# Every check that needs a CUDA GPU, in one run (about 8 minutes on an H100):
#
#   0. torch-lwlrap doctor: versions, exact values on the CPU and every GPU for each score dtype, first-call
#      (Triton JIT) and steady-state times at 1M x 527 (what a user pastes into an issue);
#   1. the whole test suite on the GPU (CUDA tests and the compiled Triton kernel included);
#   2. benchmarks/gpu_check.py: every engine path on CUDA against exact references, the no-sync check of
#      `update(validate_args=False)`, timings against the read floor, and the Triton tile sweep;
#   3. the benchmark sweep on CUDA (python -m benchmarks --device cuda), with its JSON, markdown and plot.
#
# Run from the repository root on a machine with torch, Triton and the test dependencies installed:
#
#   OUT=/tmp/gpu bash benchmarks/gpu_session.sh
#
# Results land in $OUT (default: gpu_session_results/): doctor.txt/.json, pytest.log, gpu_check.md/.json/.log,
# cuda.md/.json/.png and sweep.log.
# STEPS picks the steps (default "0 1 2 3"): e.g. STEPS="0 1" and then STEPS="2 3" split the run in two.
# PYTEST_ARGS (default: the whole suite) narrows step 1, so that it too can be split across runs, e.g.
#   PYTEST_ARGS="tests/test_core.py tests/test_reliability.py" and then
#   PYTEST_ARGS="--ignore=tests/test_core.py --ignore=tests/test_reliability.py" (pytest.log is named after the part).
# The exit status is that of the first step that failed (0: 4, 1: 1, 2: 2, 3: 3); 5 where nothing ran: no CUDA GPU
# that torch can use, no torch, or a STEPS entry that names no step.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu_session_results}"
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" PYTHONUNBUFFERED=1
status=0
steps=" ${STEPS:-0 1 2 3} "
for step in $steps; do
    case "$step" in
        0|1|2|3) ;;
        *) echo "gpu_session.sh: STEPS=\"${STEPS:-}\" names no step '$step': give some of 0 1 2 3, space-separated" >&2
           exit 5 ;;
    esac
done

# Without a CUDA GPU torch can see, nothing here measures what it is for: say so in one line and stop (status 5),
# before anything is written.
if ! python3 -c 'import torch' 2>/dev/null; then
    echo "gpu_session.sh: torch does not import in this Python ($(command -v python3)): install torch and the test" \
         "dependencies first (README.md, Install)" >&2
    exit 5
fi
if ! python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu_session.sh: no CUDA GPU that torch can use here (torch.cuda.is_available() is False: a CPU build of" \
         "torch, no GPU or no driver); run it on a machine with one, or torch-lwlrap doctor for the CPU alone" >&2
    exit 5
fi
mkdir -p "$out"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"

if [[ "$steps" == *" 0 "* ]]; then
    echo "== 0. torch-lwlrap doctor"
    python3 -m torch_lwlrap doctor | tee "$out/doctor.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || [ "$status" -ne 0 ] || status=4
    python3 -m torch_lwlrap doctor --json > "$out/doctor.json" || true
fi

if [[ "$steps" == *" 1 "* ]]; then
    echo "== 1. test suite on $(python3 -c 'import torch; print(torch.cuda.get_device_name(0))')"
    log="$out/pytest${PYTEST_ARGS:+-$(printf %s "$PYTEST_ARGS" | tr -c 'A-Za-z0-9' '_' | cut -c1-60)}.log"
    # shellcheck disable=SC2086
    python3 -m pytest -q -p no:cacheprovider -rs --durations=15 ${PYTEST_ARGS:-} 2>&1 | tee "$log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || [ "$status" -ne 0 ] || status=1
fi

if [[ "$steps" == *" 2 "* ]]; then
    echo "== 2. gpu_check"
    python3 benchmarks/gpu_check.py --out "$out/gpu_check" 2>&1 | tee "$out/gpu_check.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || [ "$status" -ne 0 ] || status=2
    for f in results.md results.json; do
        [ -f "$out/gpu_check/$f" ] && mv "$out/gpu_check/$f" "$out/gpu_check.${f#results.}"
    done
    rmdir "$out/gpu_check" 2>/dev/null
fi

if [[ "$steps" == *" 3 "* ]]; then
    echo "== 3. benchmark sweep on CUDA"
    # The sweep rewrites cuda.json and cuda.md after every case: a run stopped by a time limit keeps what it measured.
    python3 -m benchmarks --device cuda --tag cuda --out "$out" 2>&1 | tee "$out/sweep.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || [ "$status" -ne 0 ] || status=3
fi

exit "$status"
