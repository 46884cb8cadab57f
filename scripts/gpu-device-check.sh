#!/usr/bin/env bash
# The GPU operators on a machine with a hardware GPU (issue 20's NVIDIA
# figures): the device tool's machine has no Rust toolchain, no internet and
# maybe no Vulkan loader, so the binary and the loader travel with the tree.
#
#   here:   bash scripts/gpu-device-check.sh pack
#           (a stripped, zstd-compressed target/ci/cirro, libvulkan.so.1 and
#           the SSB queries in gpu-check/, an ignored path: carry it)
#   there:  bash scripts/gpu-device-check.sh run [SF]      (default SF 1)
#           writes $OUT/gpu-check.md (or ./gpu-check-out/) and the raw logs
#
# `run` works on any Vulkan device (lavapipe too, reported as software). It
# says plainly when no Vulkan device appears. Per SSB query: the median of
# hot runs with `SET gpu = off`, `force` and `on` in one process, whether the
# answers agree, and from one EXPLAIN ANALYZE under `force` the GPU
# operators' upload and kernel times and blocks. Every loop is bounded.
set -euo pipefail
cd "$(dirname "$0")/.."
PACK=gpu-check
RUNS=${GPU_CHECK_RUNS:-3}

pack() {
    local target=${CARGO_TARGET_DIR:-$HOME/.cache/cirro/target}
    local binary=$target/ci/cirro
    [ -x "$binary" ] || { echo "no $binary: build with --profile ci first" >&2; exit 1; }
    rm -rf "$PACK" && mkdir -p "$PACK/lib" "$PACK/queries"
    strip -o "$PACK/cirro" "$binary"
    zstd -q -19 -T0 --rm "$PACK/cirro" -o "$PACK/cirro.zst"
    # The loader only (the device's driver is the machine's own).
    local loader
    loader=$(ldconfig -p | awk '/libvulkan\.so\.1 / {print $NF; exit}')
    [ -n "$loader" ] || { echo "no libvulkan.so.1 here: apt-get install libvulkan1" >&2; exit 1; }
    cp -L "$loader" "$PACK/lib/libvulkan.so.1"
    local queries=${SSB_QUERIES:-../shared/ssb/queries}
    cp "$queries"/q*.sql "$PACK/queries/"
    du -sh "$PACK"
}

# The median of the numbers on stdin.
median() {
    sort -g | awk '{v[NR] = $1} END {if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}

run() {
    local sf=${1:-1}
    local out=${OUT:-$PWD/gpu-check-out}
    mkdir -p "$out"
    local report=$out/gpu-check.md work
    work=$(mktemp -d /tmp/gpu-check.XXXXXX)
    [ -f "$PACK/cirro.zst" ] || { echo "no $PACK/cirro.zst: run 'pack' on the build machine and carry $PACK" >&2; exit 1; }
    zstd -q -d -f "$PACK/cirro.zst" -o "$work/cirro" && chmod +x "$work/cirro"
    local cirro=$work/cirro data=$work/data
    # The machine's loader where it has one, else the one carried.
    if ! ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1 '; then
        export LD_LIBRARY_PATH=$PWD/$PACK/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    fi
    {
        echo "# GPU operators on $(hostname): SSB SF$sf"
        echo
        echo "- GPUs: $( (nvidia-smi -L 2>/dev/null || echo none listed by nvidia-smi) | tr '\n' ';')"
        echo "- Vulkan drivers (ICD files): $(ls /usr/share/vulkan/icd.d /etc/vulkan/icd.d 2>/dev/null | grep json | tr '\n' ' ' || true)"
        echo "- loader: ${LD_LIBRARY_PATH:+carried }libvulkan.so.1; CPUs: $(nproc)"
    } > "$report"
    local device
    device=$("$cirro" --data "$data" --gpu-memory 8GB sql --format csv \
        -c "SELECT coalesce(device, 'NONE') || ' | software=' || coalesce(CAST(software AS TEXT), '-') FROM cirro.gpu" \
        2> "$out/device.log" | sed -n 2p || true)
    echo "- device: ${device:-the query failed, see device.log}" >> "$report"
    case "$device" in
    NONE* | "")
        echo >> "$report"
        echo "No Vulkan device appeared: no GPU figures (see device.log)." >> "$report"
        cat "$report"
        return 0
        ;;
    esac
    local started=$SECONDS
    timeout 900 "$cirro" --data "$data" load ssb --sf "$sf" > "$out/load.log" 2>&1
    echo "- SSB SF$sf loaded in $((SECONDS - started)) s" >> "$report"
    {
        echo
        echo "Medians of $RUNS hot runs (after one warm-up each) in one process, --gpu-memory 8GB."
        echo
        echo "| query | off s | force s | force/off | on s | on/off | upload ms | kernels ms | device blocks | CPU blocks | same answer |"
        echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    } >> "$report"
    local q
    for q in "$PACK"/queries/q*.sql; do
        local id sql
        id=$(basename "$q" .sql)
        sql=$(sed -e 's/--.*$//' "$q" | tr '\n' ' ' | sed -e 's/;[[:space:]]*$//')
        {
            local mode i
            for mode in off force on; do
                echo "SET gpu = $mode;"
                for i in $(seq 0 "$RUNS"); do echo "$sql;"; done
            done
            echo "SET gpu = force;"
            echo "EXPLAIN ANALYZE $sql;"
        } > "$work/$id.sql"
        local log=$out/$id.log
        # Results on stdout, `(n rows)` and `Time:` on stderr, in order.
        timeout 600 "$cirro" --data "$data" --gpu-memory 8GB sql --format csv -f "$work/$id.sql" \
            > "$log" 2>&1 || true
        # Statement k's output: the lines before its `Time:` line. Per mode:
        # SET, a warm-up (which takes any message of the device's opening),
        # RUNS runs; then SET and the EXPLAIN ANALYZE.
        local per=$((RUNS + 2))
        chunk() { awk -v k="$1" '/^Time: / {n++; next} n == k - 1 {print}' "$log"; }
        times() {
            grep '^Time: ' "$log" | sed -n "$(($1 * per + 3)),$(($1 * per + per))p" |
                awk '{print $2 / 1000}' | median
        }
        local off force on same=NO
        off=$(times 0) force=$(times 1) on=$(times 2)
        # The answers of each mode's last run, as text.
        if [ -n "$(chunk "$per")" ] && [ "$(chunk "$per")" = "$(chunk $((2 * per)))" ] &&
            [ "$(chunk "$per")" = "$(chunk $((3 * per)))" ]; then
            same=yes
        fi
        local plan upload kernel blocks cpu
        plan=$(chunk $((3 * per + 2)) | grep 'Gpu' || true)
        upload=$(echo "$plan" | grep -o 'gpu_upload_time=[0-9.]*[µnm]*s' | sed 's/gpu_upload_time=//' | ms_sum)
        kernel=$(echo "$plan" | grep -o 'gpu_kernel_time=[0-9.]*[µnm]*s' | sed 's/gpu_kernel_time=//' | ms_sum)
        blocks=$(echo "$plan" | grep -o ' gpu_blocks=[0-9]*' | awk -F= '{s += $2} END {print s + 0}')
        cpu=$(echo "$plan" | grep -o 'cpu_blocks=[0-9]*' | awk -F= '{s += $2} END {print s + 0}')
        printf '| %s | %.3f | %.3f | %.2f | %.3f | %.2f | %.1f | %.1f | %s | %s | %s |\n' \
            "$id" "$off" "$force" "$(awk -v a="$force" -v b="$off" 'BEGIN {print (b > 0) ? a / b : 0}')" \
            "$on" "$(awk -v a="$on" -v b="$off" 'BEGIN {print (b > 0) ? a / b : 0}')" \
            "$upload" "$kernel" "$blocks" "$cpu" "$same" >> "$report"
    done
    rm -rf "$work"
    cat "$report"
}

# The sum, in ms, of durations such as 1.5ms, 250µs, 2s, 30ns on stdin.
ms_sum() {
    awk '{v = $1 + 0; u = $1; sub(/^[0-9.]+/, "", u);
          f = (u == "s") ? 1000 : (u == "ms") ? 1 : (u == "µs" || u == "us") ? 0.001 : (u == "ns") ? 0.000001 : 0;
          s += v * f} END {printf "%.3f\n", s}'
}

case "${1:-}" in
pack) pack ;;
run) shift; run "$@" ;;
*) echo "usage: $0 pack | run [SF]" >&2; exit 2 ;;
esac
