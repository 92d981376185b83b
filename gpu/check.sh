#!/usr/bin/env bash
# The GPU check: run on a machine with an NVIDIA GPU, from the repository root, after
# `cargo xtask build --cuda` has put the engine's CUDA binaries in gpu/bin (carried there:
# the GPU machine has no Rust and no network). Under 5 minutes. Writes under $OUT:
#   system.txt   the card, driver and nvcc; the binary's libraries as the loader resolves them
#   model-*.log  making the random-weight models from the bundled tokenizer (gpu/bin/tokenizer.gguf)
#   smoke-*.json prompts of different lengths alone and together: the same greedy answers
#                (mistral.rs's scheduler; make-room's, whole and in chunks)
#   probe-1b.*   make-room's probe off and on: JSON, its log, the scheduler's trace
#   summary.txt  one line per step, ok or FAILED
# Exits non-zero if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/sublet-gpu-check}
WORK=${WORK:-/tmp/sublet-gpu-work}
mkdir -p "$OUT" "$WORK"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
failed=0
step() { # step NAME COMMAND...: run, log, and record ok or FAILED
    local name=$1; shift
    local started=$SECONDS
    if "$@" > "$OUT/$name.log" 2>&1; then
        echo "ok     $name ($((SECONDS - started)) s)" | tee -a "$SUMMARY"
    else
        echo "FAILED $name ($((SECONDS - started)) s): see $name.log" | tee -a "$SUMMARY"
        tail -20 "$OUT/$name.log"
        failed=1
    fi
}

{
    echo "# $(date -u +%FT%TZ) at $(git rev-parse --short HEAD 2>/dev/null || echo "an unknown commit"); gpu/bin built at $(cat gpu/bin/COMMIT 2>/dev/null || echo "?")"
    nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,compute_cap --format=csv
    nvcc --version | tail -2
} > "$OUT/system.txt" 2>&1
cat "$OUT/system.txt"

# CUDA's libraries from the Python wheels beside PyTorch (cuBLAS, cuRAND, NVRTC, the runtime);
# the driver's own libcuda from the system.
SITE=$(python3 -c 'import site; print(site.getsitepackages()[0])')
for lib in "$SITE"/nvidia/cu13/lib "$SITE"/nvidia/*/lib; do
    [ -d "$lib" ] && LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}"
done
export LD_LIBRARY_PATH

unpack() { # gpu/bin/NAME.xz -> $WORK/NAME (xz may be missing: Python's lzma is not)
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
        "gpu/bin/$1.xz" "$WORK/$1" && chmod +x "$WORK/$1"
}
step unpack unpack gpu_check
{ echo; echo "# ldd gpu_check"; ldd "$WORK/gpu_check"; } >> "$OUT/system.txt" 2>&1
step libraries-resolve bash -c "! ldd '$WORK/gpu_check' | grep 'not found'"

for size in 135m 1b; do
    step "model-$size" "$WORK/gpu_check" model --template gpu/bin/tokenizer.gguf --size "$size" \
        --seed 1 --out "$WORK/random-$size.gguf"
    step "smoke-$size" "$WORK/gpu_check" smoke --model "$WORK/random-$size.gguf" --device cuda \
        --kv-pool 65536 --json "$OUT/smoke-$size.json"
done

# make-room's probe on the paged path: the voice turn alone, then beside agents that fill
# the KV budget or prefill, with make-room's switches off (it schedules as stock: first
# come, first served) and on. The JSON and the scheduler's trace under $OUT.
step unpack-probe unpack make_room_probe
step probe-1b env SUBLET_SCHEDULER_TRACE="$OUT/probe-1b-trace.txt" "$WORK/make_room_probe" \
    --model "$WORK/random-1b.gguf" --device cuda --kv-pool 65536 --json "$OUT/probe-1b.json"
xz -9 "$OUT/probe-1b-trace.txt" 2>/dev/null || gzip -9 "$OUT/probe-1b-trace.txt" 2>/dev/null
grep -A8 "voice turn alone" "$OUT/probe-1b.log" 2>/dev/null
exit $failed
