#!/usr/bin/env bash
# The one device call (docs/gpu.md, "Runbook"): from the repo root on a lent GPU machine,
#
#     bash bench/gpu/speed.sh [check.py's flags and key=value settings]
#
# installs the carried wheels (bench/gpu/env.sh), then runs bench/gpu/check.py --speed: the
# trainer and nanoGPT at `small` and `large`, their ratios and MFU, then the edges while its
# budget lasts (--budget-s 450 by default, inside the call's timeout_s 540). The report goes to
# stdout and to $OUT/speed.json after every run (so a call cut off still returns what it
# measured), every run's output to $OUT/speed.log. Without OUT (by hand) they go to a new
# temporary directory, named on stderr. Its exit code is check.py's (docs/gpu.md, "Exit codes").
set -o pipefail
out="${OUT:-$(mktemp -d)}"
[[ -n "${OUT:-}" ]] || echo "speed.sh: no OUT; the report and log go to $out" >&2
# shellcheck source=bench/gpu/env.sh
. bench/gpu/env.sh || exit
PYTHONUNBUFFERED=1 "${PYTHON:-python3}" bench/gpu/check.py --speed --log "$out/speed.log" \
    --out "$out/speed.json" "$@"
