#!/usr/bin/env bash
# One prepared accelerator check, within 8 minutes on one accelerator machine (so a lent machine can run it twice):
#   1. the machine: the device list and lane plan (python -m mirror_core devices), torch's build;
#   2. the accelerator-marked tests (tests/test_accelerator.py: every decoder equals AR on the device, per lane
#      mapping; stream sync) and the device-layer tests;
#   3. scripts/gpu_bench.py: the default pair and 1B/7B-shaped random models with replayed acceptance.
# Results go to one folder: $OUT (the device tool's), else ./gpu_check_out. Needs requirements.txt installed
# (nothing is downloaded). `scripts/gpu_check.sh --dry-run` runs the same steps on the CPU with tiny models,
# to check the script itself; there the accelerator tests skip.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_check_out}"
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 MIRROR_SD_CACHE="$OUT/cache"
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
start=$(date +%s)
{
  date -u
  python -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
  (command -v nvidia-smi > /dev/null && nvidia-smi) || true
  python -m mirror_core devices
} > "$OUT/machine.txt" 2>&1
timeout 240 python -m pytest -q -rs tests/test_accelerator.py tests/test_devices.py > "$OUT/tests.txt" 2>&1
tests_rc=$?
if [ $DRY = 1 ]; then
  timeout 200 python scripts/gpu_bench.py --device cpu --tiny --out "$OUT/bench" > "$OUT/bench.txt" 2>&1
else
  timeout 270 python scripts/gpu_bench.py --out "$OUT/bench" > "$OUT/bench.txt" 2>&1
fi
bench_rc=$?
echo "tests rc=$tests_rc, bench rc=$bench_rc, $(( $(date +%s) - start )) s; results in $OUT" | tee "$OUT/summary.txt"
tail -n 3 "$OUT/tests.txt"
[ $tests_rc = 0 ] && [ $bench_rc = 0 ]
