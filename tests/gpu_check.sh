#!/usr/bin/env bash
# The GPU session in one command (for the device machine): build for the H200 (sm_90), run every test
# binary (GPU tests included), compute-sanitizer over the kernel tests, then the benchmark.
# Usage: tests/gpu_check.sh [OUT_DIR]   (logs go to OUT_DIR, default build-gpu/logs)
set -uo pipefail
out=${1:-build-gpu/logs}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
make -j"$(nproc)" BUILD=build-gpu CUDA_ARCH=90 all $(for c in 01 02 03 04 05 06 07; do echo build-gpu/test_ch$c; done) \
  build-gpu/test_e2e > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
status=0
for t in build-gpu/test_ch0{1,2,3,4,5,6,7} build-gpu/test_e2e; do
  "$t" --gtest_brief=1 > "$out/$(basename "$t").log" 2>&1 || status=1
  tail -3 "$out/$(basename "$t").log" | sed "s|^|$(basename "$t"): |"
done
if [ "${SANITIZE_GPU:-1}" = 1 ]; then
  compute-sanitizer --tool memcheck --error-exitcode 9 build-gpu/test_ch05 --gtest_filter='*Cuda*' > "$out/memcheck.log" 2>&1
  echo "memcheck ch05: exit $? $(grep -c 'ERROR SUMMARY: 0 errors' "$out/memcheck.log") clean summaries"
fi
exit $status
