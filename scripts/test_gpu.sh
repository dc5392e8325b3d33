#!/usr/bin/env bash
# `make test-gpu`: the whole suite on a machine whose python3 already has a CUDA build of torch (the GPU tests,
# skipped elsewhere, run here). Missing packages come from .whl/ when it exists (offline machines: fill it with
# scripts/gpu_wheels.sh where pip reaches PyPI), else from PyPI. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"
"$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'make test-gpu: torch sees no CUDA device')"
if [ -d .whl ]; then
  site="$(pwd)/.gpu-site"
  "$py" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" .whl/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  export PATH="$site/bin:$PATH"
fi
"$py" -m pip install -q --no-deps --no-build-isolation -e .  # kprof itself, with its TensorBoard entry point
# One GPU: the suite is written for one (two-rank tests run gloo on the CPU). With several visible, Lightning's
# Trainer(devices="auto") starts DDP across them from inside a test worker, and the FSDP2 example takes NCCL.
visible="${CUDA_VISIBLE_DEVICES:-0}"
export CUDA_VISIBLE_DEVICES="${visible%%,*}"
# The tests marked serial start child processes that profile (the GPU, or pinned CPU cores). Beside a dozen workers
# doing the same they ran past 300 s; after the rest, one at a time, they made the suite last over 10 minutes on
# the H100. So they run at the same time as the rest, one at a time on CPU cores of their own: the last
# $serial_cores cores take them, the parallel workers the others (one worker a core). On a machine too small to
# share, they run after the rest, as before.
# Exit status 5 (no test selected, e.g. a path without such tests) counts as success in either part.
cores=$(nproc)
serial_cores=4
run_part() {  # run_part CORES_OR_EMPTY ARGS...: pytest on those cores (all when empty); 5 -> 0
  local cpus=$1 rc=0
  shift
  if [ -n "$cpus" ]; then
    taskset -c "$cpus" "$py" -m pytest "$@" || rc=$?
  else
    "$py" -m pytest "$@" || rc=$?
  fi
  [ "$rc" -eq 5 ] && rc=0
  return "$rc"
}
# On 32 cores or more the serial tests take two lanes of $serial_cores cores each: run_all.py --quick (one of the two
# longest) in one, the others one after another in the other.
lanes=1
[ "$cores" -ge $((8 * serial_cores)) ] && lanes=2
status=0
if [ "$cores" -ge $((3 * serial_cores)) ] && command -v taskset >/dev/null; then
  shared=$((cores - lanes * serial_cores))
  log="$(mktemp -t kprof-serial.XXXXXX)"
  (
    if [ "$lanes" -eq 2 ]; then
      run_part "$((shared + serial_cores))-$((cores - 1))" --timeout 300 -m serial -k run_all "$@" -n 0 >"$log.2" 2>&1 &
      lane=$!
      rc=0
      run_part "$shared-$((shared + serial_cores - 1))" --timeout 300 -m serial -k "not run_all" "$@" -n 0 || rc=$?
      wait "$lane" || rc=$?
      echo "---- the second lane: run_all.py --quick ----"
      cat "$log.2"
      rm -f "$log.2"
      exit "$rc"
    fi
    run_part "$shared-$((cores - 1))" --timeout 300 -m serial "$@" -n 0
  ) >"$log" 2>&1 &
  serial=$!
  # One intra-op thread a worker (each would otherwise start one a core: 28 workers x 28 threads stretched a 1 ms CPU
  # step to 360 ms and broke the timing tests); the serial tests above keep the threads of their own cores.
  OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" run_part "0-$((shared - 1))" -n "$shared" --timeout 300 -m "not serial" "$@" \
    || status=$?
  rc=0
  wait "$serial" || rc=$?
  echo "---- the tests marked serial (cores $shared-$((cores - 1)), $lanes lane(s), run beside the others) ----"
  cat "$log"
  rm -f "$log"
else
  run_part "" -n "$(( cores < 8 ? cores : 8 ))" --timeout 300 -m "not serial" "$@" || status=$?
  rc=0
  run_part "" --timeout 300 -m serial "$@" -n 0 || rc=$?
fi
[ "$rc" -eq 0 ] || status=$rc
exit "$status"
