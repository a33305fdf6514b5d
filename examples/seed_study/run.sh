#!/usr/bin/env bash
# Regenerate every seed-study sweep (CSV, PNG, SVG, table.txt) in place. ~10 minutes on 2 cores (a: 4, b: 2, e: 4).
# Usage: examples/seed_study/run.sh [a|b|c|d|e ...]   (default: all). --force: the outputs are ours.
set -euo pipefail
cd "$(dirname "$0")"
export COLUMNS=200   # wide rich tables in the *.txt files
P=${PLANNER:-planner}
FAMILY=megatron-1t,seed-2t,seed-4t,seed-8t,seed-16t,seed-32t,seed-64t,seed-128t
run() { local dir=$1; shift; echo "== $dir: planner $*" >&2; (cd "$dir" && "$P" "$@"); }
sel=("$@")
has() { [ ${#sel[@]} -eq 0 ] && return 0; for s in "${sel[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

if has a; then  # (a) MFU vs model size on 4096 H100, without / with 512 GiB / 1 TiB offload per GPU
  run a_model_size sweep -s h100-offload-1tib -g 4096 --framework any --vary model=$FAMILY \
      --vary offload_gib=0,512,1024 --out . --name framework_any --force > a_model_size/framework_any.txt
  run a_model_size sweep -s h100-offload-1tib -g 4096 --framework megatron --vary model=$FAMILY \
      --vary offload_gib=0,1024 --out . --name framework_megatron --force > a_model_size/framework_megatron.txt
fi
if has b; then  # (b) offload capacity x bandwidth for a 32T model on 4096 H100
  run b_offload sweep -m seed-32t -s h100-offload-1tib -g 4096 --framework any \
      --vary offload_gib=256:2048:x2 --vary offload_gb_per_s=50,100,inf --out . --force > b_offload/table.txt
fi
if has c; then  # (c) strong scaling of Megatron 1T, NVLink domain 8 vs 16
  run c_strong_scaling sweep -m megatron-1t -s h100-sxm --vary gpus=4096:16384:x2 --vary nvlink_domain=8,16 \
      --out . --force > c_strong_scaling/table.txt
fi
if has d; then  # (d) 256 vs 254 blocks: mapping counts and best MFU on 4096 H100
  {
    for m in seed-1t-256blocks seed-1t-254blocks; do
      "$P" count -m $m -s h100-sxm -g 4096 --free-batch
      "$P" count -m $m -s h100-sxm -g 4096 --global-batch 1536
      "$P" count -m $m -s h100-sxm -g 4096 --free-batch --framework any
    done
  } > d_block_count/count.txt
  run d_block_count sweep -s h100-sxm -g 4096 --vary model=seed-1t-256blocks,seed-1t-254blocks \
      --vary max_batch=1536,3072 --out . --force > d_block_count/table.txt
fi
if has e; then  # (e) the 128T statement: HBM 80 vs 120 GiB x offload 512 GiB .. 2 TiB
  run e_128t_hbm sweep -m seed-128t -s h100-offload-1tib -g 4096 --framework any \
      --vary offload_gib=512:2048:x2 --vary hbm_gib=80,120 --out . --force > e_128t_hbm/table.txt
fi
