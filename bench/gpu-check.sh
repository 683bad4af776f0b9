#!/usr/bin/env bash
# bench/gpu-check.sh — build the CUDA backend, its tests and the GPU benchmarks
# with plain nvcc/gcc (no meson, no Debian packages: the CPU reference is
# built with -DM6_NO_GEMM_LIB), run the GPU tests and benchmarks, print the
# figures and end with one key=value line. The trainer test (test_trainer)
# also needs jansson and zlib; where their headers and libraries are
# missing it is not built, and the script says so (trainer_ok=no_libs).
# Made for a machine with one sm_90 GPU and CUDA 13. Without a GPU it still
# builds everything, says so and exits 77.
#
# A lent GPU gives a session 15 minutes, starts and idle time included, and
# one device command carries at most 64 MiB (the tree plus what it names in
# carry). So the work is two prepared calls of at most 5 minutes each, both
# carrying the build folder build-gpu/ (ignored by git's /build*/):
#
#   1. Here, no GPU: bench/gpu-check.sh (builds, exits 77), then
#      bench/gpu-check.sh --size: the tree plus build-gpu/ must be at most
#      48 MiB (the test gpu_check_build checks the same on every run).
#      Every kernel, the GPU model and the CPU reference are in
#      build-gpu/lib/libm6gpu.so once; cudart and cuBLASLt are the GPU
#      machine's (its image has CUDA 13: rpath /usr/local/cuda/lib64, else
#      LD_LIBRARY_PATH, which this script sets and writes to
#      build-gpu/ld-library-path); libgomp, jansson and zlib are copied into
#      build-gpu/lib.
#   2. The tests (carry ["build-gpu"], timeout_s 300): the nine GPU tests
#      against the CPU reference within 200 s, then compute-sanitizer
#      memcheck and racecheck on test_ops and test_offload while time is
#      left (60 s each at most). Figures: each test's lines; last line
#      gpu_check_tests=pass|fail ops_ok=... trainer_ok=... build_s= total_s=
#
# T0=$(date +%s); { nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; S=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null); GPU_CHECK_PART=tests GPU_CHECK_REUSE=1 GPU_CHECK_BUDGET_S=200 bench/gpu-check.sh; echo "gpu-check: exit $?"; export LD_LIBRARY_PATH=$(cat build-gpu/ld-library-path 2>/dev/null); for t in memcheck racecheck; do for b in test_ops test_offload; do left=$((285 - $(date +%s) + T0)); [ $left -gt 60 ] && left=60; if [ -z "$S" ] || [ $left -lt 20 ]; then echo "=== sanitizer $t $b: not run (compute-sanitizer: ${S:-absent}; ${left}s left)"; continue; fi; echo "=== compute-sanitizer --tool $t $b (limit ${left}s)"; timeout $left "$S" --tool $t --error-exitcode 99 build-gpu/$b > "$OUT/san_${t}_$b.log" 2>&1; echo "=== sanitizer $t $b: exit $? (99: errors found, 124: timed out)"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|========= (Invalid|Race|Error)" "$OUT/san_${t}_$b.log" | head -8; done; done; } 2>&1 | tee "$OUT/device.log"
#
#   3. The benchmarks (carry ["build-gpu"], timeout_s 300): gpu_train at
#      124M (and its pseudo phase) and 350M, gpu_offload at 1.5B (resident
#      vs offloaded), the largest model that fits (--largest sized for 96
#      GiB of host memory: the VM has 128 GiB, its MemTotal starts lower)
#      and the speculative host AdamW, most wanted first, within 270 s.
#      Figures: each benchmark's lines; last line gpu_check_bench=pass|fail
#      tok_s_124m=... mfu_124m=... offload_ratio=... largest_params=...
#
# { nvidia-smi -L; GPU_CHECK_PART=bench GPU_CHECK_REUSE=1 GPU_CHECK_BUDGET_S=270 GPU_CHECK_HOST_GIB=96 bench/gpu-check.sh; echo "gpu-check: exit $?"; } 2>&1 | tee "$OUT/device.log"
#
# Both lengths are budgets, not GPU measurements (no run of this split has
# been on a GPU yet): each call's deadline stops what is left and reports it
# as not_run; rerun that part, or one test or benchmark with GPU_CHECK_ONLY,
# if time is left.
#
# The Pseudo-to-Real pay-off benchmark (bench/p2r_offload, issue 19 item
# 3) is built only with GPU_CHECK_P2R=1 (with jansson and zlib), with the
# fortunes shards it trains on in build-gpu/p2r-data (about 5 MiB more:
# check with --size), so carry ["build-gpu/p2r_offload", "build-gpu/lib",
# "build-gpu/p2r-data"] and run it alone as a third call, timeout_s 300
# (its 200 steps are a guess: not yet run on a GPU):
#
# nvidia-smi -L; build-gpu/p2r_offload --backend cuda --data build-gpu/p2r-data --steps 200 --out "$OUT/p2r" 2>&1 | tee "$OUT/p2r_offload.log"
#
#   bench/gpu-check.sh            build dir and log in build-gpu/
#   bench/gpu-check.sh --size [DIR]  what a device command carries (tree +
#                                 DIR, build-gpu/ by default): MiB, exit 1
#                                 above 48
#   GPU_CHECK_PART=tests|bench    only the tests (call 2) or the benchmarks
#                                 (call 3); default both
#   GPU_CHECK_CCACHE=0            compile without ccache (used where found)
#   GPU_CHECK_OBJ_FROM=DIR        take the .cu objects from the meson build
#                                 DIR where it compiled them with the same
#                                 flags (gpu_check_build: no second nvcc
#                                 pass over what meson just compiled)
#   GPU_CHECK_DIR=dir NVCC=path   override either
#   GPU_CHECK_REUSE=1             use the binaries already in GPU_CHECK_DIR
#                                 when this script built them from the same
#                                 sources (build on a CPU machine into
#                                 build-gpu/, carry it: saves the ~40 s
#                                 build on the GPU machine)
#   GPU_CHECK_BUDGET_S=S          the global deadline, S seconds after the
#                                 start (470), so that a device command can
#                                 keep time for more after this script
#                                 (the calls above: 200 and 270)
#   GPU_CHECK_ONLY="name ..."     run only these (test_ops test_moe test_model
#                                 test_model_moe test_offload test_offload_moe test_trainer
#                                 test_adafactor test_masters
#                                 train_124m train_124m_pseudo train_350m
#                                 offload_1p5b offload_largest
#                                 offload_1p5b_spec p2r_offload; the last
#                                 runs only when named here): a rerun within the GPU
#                                 time left; the rest report not_run / na,
#                                 and the exit status counts only these
#   M6_CUDA_GRAPH=0               the model's queued path instead of CUDA
#                                 graphs (gpt_cuda.h): never yet run on a
#                                 GPU; if a test dies with a
#                                 cudaErrorStreamCapture* error, rerun it so
#                                 and say which op the capture refused
#   GPU_CHECK_HOST_GIB=G          gpu_offload --largest sizes host memory
#                                 as G GiB (--host-gib) instead of
#                                 MemAvailable: for a VM whose memory grows
#                                 as it is used (MemTotal starts far lower)
#
# Exit: 0 all tests passed (test_trainer: or was not built for want of
# jansson/zlib) and the benchmarks ran, 77 no CUDA device, 1 else.
set -u -o pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
START=$(date +%s)
DEADLINE=$((START + ${GPU_CHECK_BUDGET_S:-470})) # 8 minutes minus a margin
PART=${GPU_CHECK_PART:-all}
case $PART in
tests|bench|all) ;;
*) echo "gpu-check: GPU_CHECK_PART=$PART: want tests, bench or all"; echo "gpu_check=bad_part"; exit 1 ;;
esac
CARRY_LIMIT_MIB=48 # what one device command may carry, tree and build together

# --size [DIR]: what a device command carries: the tracked and untracked
# (not ignored) files of this checkout plus DIR (the build, build-gpu/ by
# default), in MiB; exit 1 above CARRY_LIMIT_MIB (the device tool's own
# limit is 64 MiB: the margin is for whatever else a session carries)
if [ "${1:-}" = --size ]; then
    dir=${2:-$ROOT/build-gpu}
    [ -d "$dir" ] || { echo "gpu-check: --size: no build in $dir"; exit 1; }
    tree=$(git -C "$ROOT" ls-files -z -c -o --exclude-standard | (cd "$ROOT" && xargs -0 stat -c %s 2>/dev/null) | awk '{s+=$1} END {print s+0}')
    build=$(find "$dir" -type f -printf '%s\n' | awk '{s+=$1} END {print s+0}')
    mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
    total=$((tree + build))
    echo "gpu-check: a device command carries $(mib $total) MiB: the tree $(mib $tree) MiB, the build $(mib $build) MiB ($dir); limit $CARRY_LIMIT_MIB MiB"
    echo "device_carry_mib=$(mib $total) tree_mib=$(mib $tree) build_mib=$(mib $build) limit_mib=$CARRY_LIMIT_MIB"
    [ "$total" -le $((CARRY_LIMIT_MIB * 1048576)) ] && exit 0
    echo "gpu-check: over the limit: shrink the build (lib/libm6gpu.so holds every kernel once) or carry less"
    exit 1
fi

NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
if [ ! -x "$NVCC" ]; then
    echo "gpu-check: nvcc not found (set NVCC=/path/to/nvcc)"
    echo "gpu_check=no_nvcc"
    exit 1
fi
CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$NVCC")")")
CCACHE=""
[ "${GPU_CHECK_CCACHE:-1}" != 0 ] && CCACHE=$(command -v ccache || true)
OUT=${GPU_CHECK_DIR:-$ROOT/build-gpu}
mkdir -p "$OUT/obj"
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/gpu-check.log
exec > >(tee "$LOG") 2>&1

echo "gpu-check: m6 $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?') in $ROOT"
echo "gpu-check: nvcc $NVCC ($("$NVCC" --version | tail -1)), build in $OUT"
command -v nvidia-smi >/dev/null && nvidia-smi -L

# ------------------------------------------------------------------ build
# Sets build_ok and HAVE_TRAINER_LIBS; the binaries land in $OUT.
build_() {
    NVFLAGS=(-O3 -std=c++17 -lineinfo '-gencode=arch=compute_90,code=[sm_90,compute_90]' -Xcompiler -fPIC,-fno-math-errno
             -I"$ROOT" -I"$ROOT/kernels" -I"$ROOT/daemon" -I"$ROOT/kernels/cuda")
    CFLAGS=(-O2 -std=gnu11 -D_GNU_SOURCE -fopenmp -fPIC -I"$ROOT" -I"$ROOT/kernels" -I"$ROOT/daemon")
    # Every kernel, the GPU model and the CPU reference are linked once,
    # into lib/libm6gpu.so; each program holds only its own main object
    # (seven copies of the 5 MiB flash-attention fatbin made the carried
    # folder 65 MiB). cudart and cuBLASLt shared, from the toolkit's lib64
    # (this one's, or /usr/local/cuda's on the GPU machine, whose image has
    # the toolkit); the rest from build-gpu/lib (copied below; nvcc passes
    # '$ORIGIN' on as it is)
    LDFLAGS=(-L"$CUDA_HOME/lib64" -cudart shared
             -Xlinker -rpath -Xlinker '$ORIGIN/lib'
             -Xlinker -rpath -Xlinker "$CUDA_HOME/lib64"
             -Xlinker -rpath -Xlinker /usr/local/cuda/lib64 -lcublasLt -lgomp)
    KERNELS="kernels/cuda/encoder kernels/cuda/layernorm kernels/cuda/matmul
             kernels/cuda/attention kernels/cuda/gelu kernels/cuda/residual
             kernels/cuda/crossentropy kernels/cuda/adamw kernels/cuda/adafactor
             kernels/cuda/moe
             daemon/model/cuda/gpt_cuda daemon/model/cuda/moe_cuda
             daemon/model/cuda/graphs_cuda daemon/model/cuda/state_cuda
             daemon/model/cuda/optim_cuda
             daemon/offload/cuda/gpt_cuda_offload"
    # the CPU ops: kernels/meson.build's list (kernels_cpu_src), less those
    # compiled apart below (matmul, attention, gemm, moe, offload_host),
    # so that an op added there is built here too
    CPU_OPS=$(sed -n "/^kernels_cpu_src = files(/,/^)/p" kernels/meson.build |
        grep -o "'cpu/[a-z_0-9]*\.c'" | sed "s|'cpu/||; s|\.c'||" |
        grep -vxE 'matmul|attention|gemm|moe|offload_host' | tr '\n' ' ')
    case " $CPU_OPS " in
    *" adamw "*) ;;
    *) echo "gpu-check: no CPU ops read from kernels/meson.build ('$CPU_OPS')"
       exit 1 ;;
    esac

    pids=()
    names=()
    compile() { # name command... (through ccache where there is one)
        local name=$1; shift
        $CCACHE "$@" > "$OUT/obj/$name.log" 2>&1 &
        pids+=($!); names+=("$name")
    }
    # compile_cu NAME SRC.cu: nvcc, or, with GPU_CHECK_OBJ_FROM=DIR (a meson
    # build, just built: the test gpu_check_build), meson's object of SRC
    # where build.ninja shows it compiled with exactly NVFLAGS
    reused=0
    compile_cu() {
        local name=$1 src=$2 dir=${GPU_CHECK_OBJ_FROM:-} cmd want
        if [ -n "$dir" ] && [ -f "$dir/${src%.cu}.o" ]; then
            cmd=$(grep -A3 "^build ${src%.cu}.o: " "$dir/build.ninja" |
                sed -n 's/^ COMMAND = //p' | tr -d "'" | sed 's/ -MD -MF .*//' | cut -d' ' -f2-)
            want=$(printf '%s ' "${NVFLAGS[@]}" | sed 's/ $//')
            if [ "$cmd" = "$want" ]; then
                cp "$dir/${src%.cu}.o" "$OUT/obj/$name.o"
                reused=$((reused + 1))
                return
            fi
        fi
        compile "$name" "$NVCC" "${NVFLAGS[@]}" -c "$src" -o "$OUT/obj/$name.o"
    }
    for k in $KERNELS; do
        compile_cu "${k##*/}" "$k.cu"
    done
    for t in test_ops test_moe test_model test_model_moe test_offload test_offload_moe; do
        compile_cu $t tests/gpu/$t.cu
    done
    compile_cu gpu_train bench/gpu_train.cu
    compile_cu gpu_offload bench/gpu_offload.cu
    [ -n "${GPU_CHECK_OBJ_FROM:-}" ] &&
        echo "gpu-check: $reused of the .cu objects from meson's $GPU_CHECK_OBJ_FROM"
    for k in $CPU_OPS; do
        compile "cpu_$k" gcc "${CFLAGS[@]}" -c "kernels/cpu/$k.c" -o "$OUT/obj/cpu_$k.o"
    done
    compile cpu_matmul gcc "${CFLAGS[@]}" -c kernels/cpu/matmul.c -o "$OUT/obj/cpu_matmul.o"
    compile cpu_attention gcc "${CFLAGS[@]}" -c kernels/cpu/attention.c -o "$OUT/obj/cpu_attention.o"
    # the CPU GEMM as plain loops: the GPU machine has no oneDNN
    compile cpu_gemm gcc "${CFLAGS[@]}" -DM6_NO_GEMM_LIB -c kernels/cpu/gemm.c -o "$OUT/obj/cpu_gemm.o"
    compile cpu_moe gcc "${CFLAGS[@]}" -c kernels/cpu/moe.c -o "$OUT/obj/cpu_moe.o"
    # the CPU model: storage, passes and delink; its optimizer steps
    CPU_MODEL_C="daemon/model/gpt.c daemon/model/gpt_optim.c"
    for f in $CPU_MODEL_C; do
        compile "cpu_$(basename "$f" .c)" gcc "${CFLAGS[@]}" -c "$f" \
            -o "$OUT/obj/cpu_$(basename "$f" .c).o"
    done
    # the model without kernels, which gpt_cuda uses too: layout, the one
    # weight init, the CUDA activation table
    MODEL_C="daemon/model/layout.c daemon/model/facts.c daemon/model/init.c daemon/model/cuda/act_layout.c"
    for f in $MODEL_C; do
        compile "model_$(basename "$f" .c)" gcc "${CFLAGS[@]}" -c "$f" \
            -o "$OUT/obj/model_$(basename "$f" .c).o"
    done
    # the offload host jobs' loops (gpt_cuda_offload.cu), vectorised as meson
    # builds them (kernels/meson.build)
    compile cpu_offload_host gcc "${CFLAGS[@]}" -O3 -fno-math-errno -fno-trapping-math \
        -c kernels/cpu/offload_host.c -o "$OUT/obj/cpu_offload_host.o"

    # The trainer (spec, data, checkpoints, offload, both backends) for
    # test_trainer: needs jansson and zlib.
    TRAINER_SRC="daemon/train/trainer.c daemon/train/gradsync.c daemon/train/trainer_ckpt.c daemon/train/moe_ep.c daemon/train/trainer_ep.c daemon/train/backend_cpu.c daemon/train/backend_cuda.c
      daemon/spec/spec.c daemon/spec/spec_keys.c daemon/spec/spec_write.c daemon/train/data.c daemon/ckpt/checkpoint.c daemon/ckpt/init_from.c daemon/dist/collectives.c daemon/dist/local.c
      daemon/common/log.c daemon/common/durable.c daemon/common/cpus.c daemon/common/memlimit.c daemon/common/node_share.c daemon/common/cgroup.c daemon/common/threads.c daemon/common/view.c client/corpus/corpus.c daemon/offload/pool.c daemon/offload/plan.c daemon/offload/sched.c"
    # the programs linked with it: test_trainer, and bench/p2r_offload (the
    # Pseudo-to-Real pay-off under a memory budget, issue 19 item 3)
    # (GPU_CHECK_P2R=1 only: 7 MiB more, and the carried build's size
    # matters)
    TRAINER_MAINS="tests/gpu/test_trainer.c tests/gpu/test_adafactor.c tests/gpu/test_masters.c"
    [ -n "${GPU_CHECK_P2R:-}" ] && TRAINER_MAINS+=" bench/p2r_offload.c"
    TRAINER_LIBS=(-ljansson -lz -lpthread)
    if printf '#include <jansson.h>\n#include <zlib.h>\nint main(void) { json_decref(json_object()); return zlibVersion() == 0; }\n' |
        gcc -x c - -o "$OUT/obj/libcheck" "${TRAINER_LIBS[@]}" >/dev/null 2>&1; then
        HAVE_TRAINER_LIBS=yes
        for f in $TRAINER_SRC $TRAINER_MAINS; do
            n=$(basename "$f" .c)
            compile "tr_$n" gcc "${CFLAGS[@]}" -DM6_HAVE_CUDA -c "$f" -o "$OUT/obj/tr_$n.o"
        done
    else
        HAVE_TRAINER_LIBS=no
        echo "gpu-check: jansson or zlib (headers and libraries) not found: test_trainer"
        echo "gpu-check: is NOT built or run (install libjansson-dev zlib1g-dev to include it)"
    fi

    build_ok=yes
    for i in "${!pids[@]}"; do
        if ! wait "${pids[$i]}"; then
            echo "gpu-check: compiling ${names[$i]} FAILED:"
            cat "$OUT/obj/${names[$i]}.log"
            build_ok=no
        fi
    done
    KOBJ=(); for k in $KERNELS; do KOBJ+=("$OUT/obj/${k##*/}.o"); done
    KOBJ+=("$OUT/obj/cpu_offload_host.o")
    for f in $MODEL_C; do KOBJ+=("$OUT/obj/model_$(basename "$f" .c).o"); done
    COBJ=("$OUT/obj/cpu_attention.o" "$OUT/obj/cpu_gemm.o"); for k in $CPU_OPS; do COBJ+=("$OUT/obj/cpu_$k.o"); done
    for f in $CPU_MODEL_C; do COBJ+=("$OUT/obj/cpu_$(basename "$f" .c).o"); done
    mkdir -p "$OUT/lib"
    GPULIB=(-L"$OUT/lib" -lm6gpu)
    if [ $build_ok = yes ]; then
        "$NVCC" -shared -o "$OUT/lib/libm6gpu.so" "${KOBJ[@]}" "${COBJ[@]}" \
            "$OUT/obj/cpu_moe.o" "$OUT/obj/cpu_matmul.o" "${LDFLAGS[@]}" ||
            build_ok=no
    fi
    if [ $build_ok = yes ]; then
        for b in test_ops test_moe test_model test_model_moe test_offload test_offload_moe gpu_train gpu_offload; do
            "$NVCC" -o "$OUT/$b" "$OUT/obj/$b.o" "${GPULIB[@]}" "${LDFLAGS[@]}" || build_ok=no
        done
    fi
    if [ $build_ok = yes ] && [ $HAVE_TRAINER_LIBS = yes ]; then
        TOBJ=(); for f in $TRAINER_SRC; do TOBJ+=("$OUT/obj/tr_$(basename "$f" .c).o"); done
        for b in test_trainer test_adafactor test_masters $([ -n "${GPU_CHECK_P2R:-}" ] && echo p2r_offload); do
            "$NVCC" -o "$OUT/$b" "$OUT/obj/tr_$b.o" "${TOBJ[@]}" "${GPULIB[@]}" "${LDFLAGS[@]}" \
                "${TRAINER_LIBS[@]}" || build_ok=no
        done
    fi
    [ $build_ok = yes ] && travel_
}

# The shared libraries of this machine that a GPU machine may lack (the
# CUDA image has the driver and the toolkit, not our Debian packages):
# copied into $OUT/lib, where the rpath $ORIGIN/lib finds them. The object
# files go (the folder is carried: it must stay small).
travel_() {
    mkdir -p "$OUT/lib"
    local b lib
    for b in test_ops test_moe test_model test_model_moe test_offload test_offload_moe test_trainer test_adafactor test_masters p2r_offload gpu_train gpu_offload; do
        [ -x "$OUT/$b" ] || continue
        for lib in $(ldd "$OUT/$b" | awk '$3 ~ /^\// && $1 ~ /^lib(gomp|jansson|z)\.so/ {print $3}'); do
            cp -L "$lib" "$OUT/lib/$(basename "$lib")"
        done
    done
    rm -f "$OUT"/obj/*.o "$OUT/obj/libcheck"
    echo "gpu-check: $(du -sh "$OUT" | cut -f1) in $OUT, libraries carried along: $(cd "$OUT/lib" && echo *)"
}

# cuBLASLt where the rpath does not find it (a toolkit elsewhere, or only
# the pip wheel nvidia-cublas): the first folder that holds it goes into
# LD_LIBRARY_PATH (also written to $OUT/ld-library-path for commands run
# after this script, such as compute-sanitizer).
find_cublaslt_() {
    local b=$OUT/test_ops d lib
    [ -x "$b" ] || return 0
    : > "$OUT/ld-library-path"
    for lib in libcublasLt.so.13 libcudart.so.13; do
        ldd "$b" 2>/dev/null | grep -q "$lib.*not found" || continue
        for d in "$CUDA_HOME/lib64" /usr/local/cuda/lib64 /usr/local/cuda-13*/lib64 \
                 /usr/local/cuda*/targets/x86_64-linux/lib \
                 $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, s, "lib") for p in nvidia.__path__ for s in ("cu13", "cublas", "cuda_runtime")))' 2>/dev/null); do
            if [ -e "$d/$lib" ]; then
                export LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
                echo "$LD_LIBRARY_PATH" > "$OUT/ld-library-path"
                echo "gpu-check: $lib from $d (LD_LIBRARY_PATH)"
                continue 2
            fi
        done
        echo "gpu-check: $lib not found (not in the rpath, $CUDA_HOME/lib64, /usr/local/cuda*, nor python3's nvidia packages)"
    done
}

# GPU_CHECK_REUSE=1: binaries already in GPU_CHECK_DIR, built by this script
# from these very sources (a hash of them is kept beside them), are used as
# they are: build here, carry the dir, save the build time on the GPU
# machine. Anything else (no binaries, other sources) builds.
src_hash_() { # the sources, and this script (how they are built and linked)
    (cd "$ROOT" && { find kernels daemon client bench tests/gpu tests/common -type f \
        \( -name "*.c" -o -name "*.h" -o -name "*.cu" -o -name "*.cuh" \) |
        LC_ALL=C sort; echo bench/gpu-check.sh; } | xargs cat | sha256sum | cut -c1-16)
}
SRC_HASH=$(src_hash_)
find_cublaslt_
reuse=no
if [ -n "${GPU_CHECK_REUSE:-}" ] && [ "$(cat "$OUT/src-hash" 2>/dev/null)" = "$SRC_HASH" ]; then
    reuse=yes
    for b in test_ops test_moe test_model test_model_moe test_offload test_offload_moe gpu_train gpu_offload; do
        # present, and its libraries (cudart, cuBLASLt by rpath) found here
        { [ -x "$OUT/$b" ] && ! ldd "$OUT/$b" 2>&1 | grep -q "not found"; } || reuse=no
    done
fi
if [ $reuse = yes ]; then
    build_ok=yes
    HAVE_TRAINER_LIBS=no
    if [ -x "$OUT/test_trainer" ] && ! ldd "$OUT/test_trainer" | grep -q "not found"; then
        HAVE_TRAINER_LIBS=yes
    else
        echo "gpu-check: the reused test_trainer is missing or lacks a library here: not run"
    fi
    echo "gpu-check: reusing the binaries in $OUT (sources $SRC_HASH)"
else
    [ -n "${GPU_CHECK_REUSE:-}" ] && echo "gpu-check: GPU_CHECK_REUSE: no binaries of these sources in $OUT: building"
    rm -rf "$OUT/src-hash" "$OUT"/test_{ops,model,model_moe,offload,offload_moe,trainer,adafactor,masters} "$OUT"/gpu_{train,offload} \
        "$OUT/p2r_offload" "$OUT/p2r-data"
    build_
    [ $build_ok = yes ] && echo "$SRC_HASH" > "$OUT/src-hash"
    [ $build_ok = yes ] && find_cublaslt_
fi
# p2r_offload's text (GPU_CHECK_P2R=1): fortunes as shards in
# $OUT/p2r-data (about 5 MiB), prepared where the build runs (the GPU
# machine has no fortunes) and carried with the binary
P2R_DATA=$OUT/p2r-data
if [ $build_ok = yes ] && [ -x "$OUT/p2r_offload" ] && [ ! -f "$P2R_DATA/train_000000.bin" ]; then
    "$OUT/p2r_offload" --prepare --data "$P2R_DATA" ||
        echo "gpu-check: p2r_offload: no shards in $P2R_DATA (Debian's fortunes missing?): it will fail"
fi
BUILD_S=$(( $(date +%s) - START ))
echo "gpu-check: build ${build_ok} in ${BUILD_S} s"
if [ $build_ok != yes ]; then
    echo "gpu_check=build_failed build_s=$BUILD_S"
    exit 1
fi

# ------------------------------------------------------------------ run
# run NAME MAX_SECONDS CMD...: runs under the smaller of MAX_SECONDS and the
# time left before the deadline; sets RC (124 timeout, 125 no time left).
only_() { # NAME: 0 when NAME is to run (GPU_CHECK_ONLY unset or names it)
    [ -z "${GPU_CHECK_ONLY:-}" ] && return 0
    case " $GPU_CHECK_ONLY " in *" $1 "*) return 0;; esac
    return 1
}
run() {
    local name=$1 max=$2; shift 2
    rm -f "$OUT/$name.out" # no figures from an earlier run in this dir
    if ! only_ "$name"; then
        echo "gpu-check: $name: not in GPU_CHECK_ONLY, not run"
        RC=125
        return
    fi
    local left=$((DEADLINE - $(date +%s)))
    [ "$left" -lt "$max" ] && max=$left
    if [ "$max" -lt 15 ]; then
        echo "gpu-check: $name: no time left, not run"
        RC=125
        return
    fi
    echo
    echo "=== $name (limit ${max}s): $*"
    timeout "$max" "$@" | tee "$OUT/$name.out"
    RC=${PIPESTATUS[0]}
    [ "$RC" -eq 124 ] && echo "gpu-check: $name TIMED OUT after ${max}s"
    echo "=== $name: exit $RC"
}
verdict() { # exit code -> yes / no / skip / timeout
    case $1 in 0) echo yes;; 77) echo skip;; 124) echo timeout;; 125) echo not_run;; *) echo no;; esac
}
kv() { # NAME KEY [FIRST]: KEY's value on the last key=value line of NAME's
       # output, the line that starts with FIRST= (default tokens_per_s)
    local v
    v=$(grep "^${3:-tokens_per_s}=" "$OUT/$1.out" 2>/dev/null | tail -1 | tr ' ' '\n' |
        sed -n "s/^$2=//p")
    echo "${v:-na}"
}
okv() { kv "$1" "$2" tokens_per_s_resident; } # gpu_offload's line

# ---- part tests: the GPU tests against the CPU reference
OPS=not_run MOE=not_run MODEL=not_run MODEL_MOE=not_run OFFLOAD=not_run
OFFLOAD_MOE=not_run TRAINER=not_run ADAFACTOR=not_run MASTERS=not_run
if [ "$PART" != bench ]; then
run test_ops 90 "$OUT/test_ops";     OPS=$(verdict $RC)
run test_moe 60 "$OUT/test_moe";     MOE=$(verdict $RC)
run test_model 120 "$OUT/test_model"; MODEL=$(verdict $RC)
run test_model_moe 60 "$OUT/test_model_moe"; MODEL_MOE=$(verdict $RC)
run test_offload 120 "$OUT/test_offload"; OFFLOAD=$(verdict $RC)
run test_offload_moe 60 "$OUT/test_offload_moe"; OFFLOAD_MOE=$(verdict $RC)
if [ $HAVE_TRAINER_LIBS = yes ]; then
    run test_trainer 120 "$OUT/test_trainer"; TRAINER=$(verdict $RC)
    run test_adafactor 60 "$OUT/test_adafactor"; ADAFACTOR=$(verdict $RC)
    run test_masters 60 "$OUT/test_masters"; MASTERS=$(verdict $RC)
else
    echo "gpu-check: test_trainer, test_adafactor, test_masters not built (no jansson/zlib): skipped"
    TRAINER=no_libs ADAFACTOR=no_libs MASTERS=no_libs
fi
fi
TESTS="ops_ok=$OPS moe_ok=$MOE model_ok=$MODEL model_moe_ok=$MODEL_MOE offload_ok=$OFFLOAD offload_moe_ok=$OFFLOAD_MOE trainer_ok=$TRAINER adafactor_ok=$ADAFACTOR masters_ok=$MASTERS"
nodev_() { [ "$1" = skip ] || [ "$1" = not_run ]; } # skipped, or left out
nodevice=no
if [ "$PART" = bench ]; then
    # no test ran to say so: no GPU that nvidia-smi lists
    nvidia-smi -L 2>/dev/null | grep -q '^GPU' || nodevice=yes
elif nodev_ "$OPS" && nodev_ "$MODEL" && nodev_ "$OFFLOAD" &&
    [ "$OPS$MODEL$OFFLOAD" != not_runnot_runnot_run ]; then
    nodevice=yes
fi
if [ $nodevice = yes ]; then
    echo "gpu-check: SKIP: no CUDA device here; nothing was measured."
    echo "gpu-check: the build in $OUT ($(du -sh "$OUT" | cut -f1)) is made to be carried to a GPU"
    echo "gpu-check: machine: see the device commands at the top of bench/gpu-check.sh"
    echo "gpu_check=no_cuda_device part=$PART $TESTS build_s=$BUILD_S"
    exit 77
fi
passed_() { # NAME VERDICT: passed, or left out by GPU_CHECK_ONLY
    [ "$2" = yes ] || { ! only_ "$1" && [ "$2" = not_run ]; }
}
tests_passed_() {
    passed_ test_ops "$OPS" && passed_ test_moe "$MOE" && passed_ test_model "$MODEL" &&
        passed_ test_model_moe "$MODEL_MOE" &&
        passed_ test_offload "$OFFLOAD" && passed_ test_offload_moe "$OFFLOAD_MOE" &&
        { passed_ test_trainer "$TRAINER" || [ "$TRAINER" = no_libs ]; } &&
        { passed_ test_adafactor "$ADAFACTOR" || [ "$ADAFACTOR" = no_libs ]; } &&
        { passed_ test_masters "$MASTERS" || [ "$MASTERS" = no_libs ]; }
}
if [ "$PART" = tests ]; then
    TOTAL_S=$(( $(date +%s) - START ))
    echo
    echo "gpu-check: log $LOG"
    tests_passed_ && v=pass || v=fail
    echo "gpu_check_tests=$v $TESTS build_s=$BUILD_S total_s=$TOTAL_S"
    [ $v = pass ] && exit 0
    exit 1
fi
# ---- part bench: the benchmarks, most wanted first (the deadline cuts the
# last)
run train_124m 90 "$OUT/gpu_train" --steps 10 --warmup 3
run train_124m_pseudo 90 "$OUT/gpu_train" --share 1 --steps 10 --warmup 3 --peak-n 0 --att-reps 0
run train_350m 150 "$OUT/gpu_train" --layers 24 --embd 1024 --heads 16 --steps 10 --warmup 3 --peak-n 0 --att-reps 0
# Offloading (issue #5): GPT-2 1.5B resident vs 2/3 offloaded, clipped and
# not (~1 min: two model creations, 2 x (2 + 5 + 1 + 5) steps); then the
# largest model that fits device + host (~1-2 min, mostly host memory setup
# and host AdamW), last so that the deadline cuts it first.
run offload_1p5b 150 "$OUT/gpu_offload" --steps 5 --warmup 2 --no-clip
LARGEST=(--largest --steps 2 --warmup 1)
[ -n "${GPU_CHECK_HOST_GIB:-}" ] && LARGEST+=(--host-gib "$GPU_CHECK_HOST_GIB")
run offload_largest 150 "$OUT/gpu_offload" "${LARGEST[@]}"
# The speculative clipped host AdamW (offload.speculative, issue 19) at the
# same 1.5B shape: resident, offloaded clipped, offloaded clipped with
# speculation (step time with it on and off, the redo rate on these random
# tokens, pinned bytes requested against VmPin/VmLck/VmRSS at creation).
# Not measured on a GPU yet; after the rest, or alone with
# GPU_CHECK_ONLY=offload_1p5b_spec (~1.5 min: three model creations).
run offload_1p5b_spec 150 "$OUT/gpu_offload" --steps 5 --warmup 2 --speculative
# The Pseudo-to-Real pay-off under memory pressure (issue 19 item 3):
# GPT-2 350M (L 24, C 1024, T 1024, B 8) from scratch, 3/4 of its slots
# offloaded, against Pseudo-to-Real (S 1 resident for 30% of the steps),
# on fortunes; the wall-clock ratio to scratch's final loss (goal <= 0.8).
# Only when built (GPU_CHECK_P2R=1, with the trainer libs) and named by
# GPU_CHECK_ONLY (it needs about 3 minutes: not measured on a GPU yet, so
# its length is a guess). See the top of this file for running it alone.
if [ -n "${GPU_CHECK_ONLY:-}" ] && only_ p2r_offload && [ -x "$OUT/p2r_offload" ]; then
    run p2r_offload 300 "$OUT/p2r_offload" --backend cuda --data "$P2R_DATA" \
        --steps 200 --out "$OUT/p2r_offload_curves"
else
    rm -f "$OUT/p2r_offload.out"
    echo "gpu-check: p2r_offload: runs only when built (GPU_CHECK_P2R=1) and named by GPU_CHECK_ONLY"
fi

TOTAL_S=$(( $(date +%s) - START ))
echo
echo "gpu-check: log $LOG"
LINE=""
LINE+="tok_s_124m=$(kv train_124m tokens_per_s) ms_step_124m=$(kv train_124m ms_per_step)"
LINE+=" tok_s_124m_queued=$(kv train_124m tokens_per_s_queued) graph_speedup_124m=$(kv train_124m graph_speedup)"
LINE+=" mfu_124m=$(kv train_124m mfu) mfu_gemm_124m=$(kv train_124m mfu_vs_gemm)"
LINE+=" gemm_tflops=$(kv train_124m gemm_tflops)"
LINE+=" att_ms_flash_124m=$(kv train_124m att_ms_flash) att_ms_gemm_124m=$(kv train_124m att_ms_gemm)"
LINE+=" att_ms_tc_124m=$(kv train_124m att_ms_tc) att_tc_speedup_124m=$(kv train_124m att_tc_speedup)"
LINE+=" tok_s_124m_pseudo=$(kv train_124m_pseudo tokens_per_s) mfu_124m_pseudo=$(kv train_124m_pseudo mfu)"
LINE+=" tok_s_350m=$(kv train_350m tokens_per_s) mfu_350m=$(kv train_350m mfu)"
LINE+=" tok_s_1p5b_res=$(okv offload_1p5b tokens_per_s_resident)"
LINE+=" tok_s_1p5b_off=$(okv offload_1p5b tokens_per_s_offload)"
LINE+=" offload_ratio=$(okv offload_1p5b ratio) offload_ratio_noclip=$(okv offload_1p5b ratio_noclip)"
LINE+=" h2d_gbps=$(okv offload_1p5b h2d_gbps) pinned_peak_gbps=$(okv offload_1p5b pinned_peak_gbps)"
LINE+=" copy_ratio=$(okv offload_1p5b copy_ratio) stall_frac=$(okv offload_1p5b stall_frac)"
LINE+=" tok_s_1p5b_off_spec=$(okv offload_1p5b_spec tokens_per_s_offload_spec)"
LINE+=" tok_s_1p5b_off_nospec=$(okv offload_1p5b_spec tokens_per_s_offload)"
LINE+=" offload_ratio_spec=$(okv offload_1p5b_spec ratio_spec) redo_frac=$(okv offload_1p5b_spec redo_frac)"
LINE+=" largest_params=$(okv offload_largest largest_params)"
LINE+=" largest_layers=$(okv offload_largest largest_layers)"
LINE+=" largest_tflops=$(okv offload_largest largest_tflops)"
LINE+=" p2r_wall_ratio=$(kv p2r_offload wall_ratio backend)"
LINE+=" p2r_tok_s_pseudo=$(kv p2r_offload tok_s_pseudo backend)"
LINE+=" p2r_tok_s_real=$(kv p2r_offload tok_s_real backend)"
LINE+=" build_s=$BUILD_S total_s=$TOTAL_S"
ok=no
{ [ "$PART" = bench ] || tests_passed_; } &&
    { ! only_ train_124m || [ "$(kv train_124m tokens_per_s)" != na ]; } &&
    { ! only_ offload_1p5b || [ "$(okv offload_1p5b tokens_per_s_offload)" != na ]; } &&
    { [ -z "${GPU_CHECK_ONLY:-}" ] || ! only_ p2r_offload ||
      [ "$(kv p2r_offload wall_ratio backend)" != na ]; } && ok=yes
if [ "$PART" = bench ]; then
    echo "gpu_check_bench=$([ $ok = yes ] && echo pass || echo fail) $LINE"
else
    echo "gpu_check=$([ $ok = yes ] && echo pass || echo fail) $TESTS $LINE"
fi
[ $ok = yes ] && exit 0
exit 1
