#!/usr/bin/env bash
# A/B of the decode step and of bench.py's workload between variants of the engine, on a GPU machine (the
# comparisons of 04_model_runner/NOTES.md and 05_attention/NOTES.md). A variant is the working tree with a
# patch applied or not, built into a binary of its own, run with its own options and environment. The runs
# alternate between the variants, round after round, so that a drift of the machine shows on every side.
#
# Usage: tests/ab.sh VARIANT...
#   VARIANT  NAME[:PATCH[:OPTIONS[:ENV]]]: a name; a patch for `git apply` (empty: the tree as it is), or an
#            engine binary built elsewhere (an executable file: run as it is, nothing built); engine options
#            added to every run; VAR=VALUE settings for its runs. Examples:
#              base    v6::--linear-version 6    r256:r256.patch    pad8:pad.patch::NANOVLLM_PAD_MIB=8
#              old:/tmp/nanovllm-before
# Settings (environment):
#   AB_BATCHES  the batch sizes bench-step runs (default "1 16 64 256")
#   AB_ROUNDS   rounds of bench-step over the variants (default 2)
#   AB_STEP     bench-step's model and options (default "--random qwen3-0.6b")
#   AB_LOOP     which step time of bench-step: step (default: the synchronous loop's) or overlapped (the
#               engine's loop, each step queued before the tokens of the one ahead are read)
#   AB_BENCH    runs of bench per variant, alternating (default 2; 0: none)
#   AB_BENCH_ARGS  bench's model and options (default "--random qwen3-0.6b")
#   AB_BUILD, AB_MAKE  the build folder and make's settings (default build-gpu, "CUDA_ARCH=90")
# Prints the GPU's name, one line per batch size (each variant's step in ms, round by round: the graph step
# where there is one, else the eager step), one per bench run (tok/s, the decode steps' GB/s, the prefill steps'
# time, the median time to first token), and the range of the copy bandwidth bench-step measured in its
# runs. Exits non-zero if a patch does not apply or a variant does not build.
# Builds everything again where the sources differ from those the build folder was last built from
# (build_stamp.sh: a warm device machine keeps the objects of its call before).
set -uo pipefail
[ $# -ge 1 ] || { sed -n '2,27p' "$0"; exit 2; }
batches=${AB_BATCHES:-1 16 64 256}
rounds=${AB_ROUNDS:-2}
step_args=${AB_STEP:---random qwen3-0.6b}
loop=${AB_LOOP:-step}
[ "$loop" = step ] || [ "$loop" = overlapped ] || { echo "error: AB_LOOP must be step or overlapped, got '$loop'" >&2; exit 2; }
bench_runs=${AB_BENCH:-2}
bench_args=${AB_BENCH_ARGS:---random qwen3-0.6b}
B=${AB_BUILD:-build-gpu}
make_args=${AB_MAKE:-CUDA_ARCH=90}
mkdir -p "$B/ab"
. "$(dirname "$0")/build_stamp.sh"
touch_sources_unless_built_from_them "$B"

names=() options=() envs=()
applied=""  # the patch in the tree while its variant builds: taken out again however the script ends
trap '[ -n "$applied" ] && git apply -R "$applied"' EXIT
declare -A binary_of_patch=()  # variants with the same patch share one build
for spec in "$@"; do
  IFS=: read -r name patch opts env <<< "$spec"
  [ -n "$name" ] || { echo "error: a variant without a name: '$spec'" >&2; exit 2; }
  names+=("$name") options+=("${opts:-}") envs+=("${env:-}")
  if [ -n "${binary_of_patch[x$patch]:-}" ]; then
    cp "${binary_of_patch[x$patch]}" "$B/ab/$name"
    continue
  fi
  if [ -n "$patch" ] && [ -f "$patch" ] && [ -x "$patch" ]; then  # a binary: nothing to build
    cp "$patch" "$B/ab/$name"
    binary_of_patch[x$patch]="$B/ab/$name"
    continue
  fi
  if [ -n "$patch" ]; then
    git apply "$patch" || { echo "error: $patch does not apply (variant $name)" >&2; exit 1; }
    applied=$patch
    forget_built_from "$B"
  fi
  # shellcheck disable=SC2086  # make_args is a list of settings
  make -j"$(nproc)" BUILD="$B" $make_args "$B/nanovllm" > "$B/ab/$name.build.log" 2>&1
  built=$?
  [ $built -eq 0 ] && [ -z "$applied" ] && record_built_from_sources "$B"
  [ $built -eq 0 ] && cp "$B/nanovllm" "$B/ab/$name"
  [ -n "$applied" ] && git apply -R "$applied" && applied=""
  [ $built -eq 0 ] || { tail -20 "$B/ab/$name.build.log"; echo "error: variant $name does not build" >&2; exit 1; }
  binary_of_patch[x$patch]="$B/ab/$name"
done

# Every run's copy bandwidth, as bench-step measured it on the GPU (none on the CPU), for the line at the end.
bandwidths="$B/ab/copy_bandwidths.txt"
: > "$bandwidths"
command -v nvidia-smi > /dev/null && echo "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"

# One run of variant v: bench-step's step time in ms (the graph's where it ran one), or its overlapped one.
step_ms() {  # VARIANT_INDEX BATCH
  local v=$1 out line bandwidth
  # shellcheck disable=SC2086  # the settings and options are lists
  out=$(env ${envs[$v]} "$B/ab/${names[$v]}" bench-step $step_args --batch "$2" ${options[$v]} 2>&1)
  bandwidth=$(grep -m1 -oE 'copy bandwidth [0-9]+ GB/s' <<< "$out")
  [ -n "$bandwidth" ] && tr -dc '0-9' <<< "$bandwidth" >> "$bandwidths" && echo >> "$bandwidths"
  line=$(grep -m1 "^$loop"' \(time\|step\):' <<< "$out")
  if [[ $line =~ ^overlapped\ step:\ ([0-9.]+)\ ms ]]; then echo "${BASH_REMATCH[1]}"
  elif [[ $line =~ ([0-9.]+)\ ms\ under\ a\ CUDA\ graph ]]; then echo "${BASH_REMATCH[1]}"
  elif [[ $line =~ ^step\ time:\ ([0-9.]+)\ ms ]]; then echo "${BASH_REMATCH[1]}"
  else echo "failed"; fi
}
for b in $batches; do
  declare -A times=()
  for ((r = 0; r < rounds; r++)); do
    for v in "${!names[@]}"; do times[$v]+=" $(step_ms "$v" "$b")"; done
  done
  line="batch $b:"
  for v in "${!names[@]}"; do line+="  ${names[$v]}${times[$v]}"; done
  echo "$line"
  unset times
done
for ((r = 0; r < bench_runs; r++)); do
  for v in "${!names[@]}"; do
    # shellcheck disable=SC2086
    log=$(env ${envs[$v]} "$B/ab/${names[$v]}" bench $bench_args ${options[$v]} 2>&1)
    out=$(grep -m1 'Throughput' <<< "$log") decode=$(grep -m1 -oE '[0-9]+ GB/s over the decode steps' <<< "$log")
    prefill=$(grep -m1 -oE 'prefill steps [0-9]+ \([0-9.]+ s\)' <<< "$log") ttft=$(grep -m1 -oE 'TTFT[^;]*median [0-9.]+ ms' <<< "$log")
    echo "bench ${names[$v]}: ${out:-failed}${decode:+ (decode: $decode)}${prefill:+; $prefill}${ttft:+; ${ttft#*: }}"
  done
done
if [ -s "$bandwidths" ]; then
  echo "copy bandwidth (bench-step's, every run): $(sort -n "$bandwidths" | head -1)-$(sort -n "$bandwidths" | tail -1) GB/s over $(wc -l < "$bandwidths") runs"
fi
