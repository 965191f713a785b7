#!/bin/bash
# run.sh [quick|prefill|decode|all]: builds the emulator into build/cpu_emulator/ and runs the kernels of
# 05_attention on the CPU against the CPU reference (see README.md). `all` takes about 8 minutes.
set -e
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$ROOT/05_attention/cpu_emulator
OUT=$ROOT/build/cpu_emulator
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}
mkdir -p "$OUT/gen" "$OUT/obj"
python3 "$HERE/gen.py" "$OUT/gen"
FLAGS="-std=c++17 -O1 -g -I$HERE/shadow -I$HERE -I$ROOT -isystem $CUDA_HOME/include -DNANOVLLM_CUDA
       -DNANOVLLM_SOURCE_DIR=\"$ROOT\" -Wall -Wno-unused-function -Wno-unknown-pragmas -Wno-unused-variable"
for f in "$OUT"/gen/*.cpp "$HERE/harness.cc" "$HERE/emu_runtime.cc" "$ROOT/05_attention/attention_cpu.cpp" \
         "$ROOT"/01_sequence/base/*.cpp; do
  case "$f" in *_test.cpp) continue ;; esac
  g++ $FLAGS -x c++ -c "$f" -o "$OUT/obj/$(basename "${f%.*}").o" &
done
wait
g++ -o "$OUT/emu" "$OUT"/obj/*.o -L"$CUDA_HOME/lib64" -lcudart -Wl,-rpath,"$CUDA_HOME/lib64"
"$OUT/emu" "${1:-quick}"
