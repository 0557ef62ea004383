#!/usr/bin/env bash
# The trainer's GPU-only paths, run for real on one CUDA GPU, with a table of what happened:
#   1. bf16 on CUDA: the built-in digits config with precision bf16 and auto;
#   2. find-batch meeting a real CUDA OOM (bench/gpu_models.py: a GPT with materialised attention),
#      the margin below the largest fit, and the cache hit on a second call;
#   3. an OOM mid-run: a stream whose sequences grow from 512 to 5120 tokens at step 20, with a
#      micro-batch that fits the short ones; the run lowers it and completes (summary.oom_fallbacks);
#   4. NVML numbers (gpu_util, gpu_mem_gb) in metrics.jsonl.
# Usage: bench/gpu_paths.sh [RESULTS_DIR]   (run from the repository root; needs torch with CUDA,
# pydantic, pyyaml, psutil, scikit-learn, nvidia-ml-py). Prints the table last; logs in RESULTS_DIR.
set -uo pipefail
R=${1:-results/gpu_paths}
mkdir -p "$R"
R=$(cd "$R" && pwd)
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}

"$PY" -c 'import torch, pynvml; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0))' | tee "$R/env.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$R/env.txt"

cat >"$R/find_batch.yaml" <<EOF
model: ./bench/gpu_models.py:gpt
data: ./bench/gpu_models.py:fixed_tokens
data_args: {count: 4096, length: 2048}
project_dir: $PWD
device: cuda
precision: bf16
batch_size: auto
max_batch_size: 256
cache_dir: $R/cache
out_dir: $R/find_batch_run
EOF

cat >"$R/oom_midrun.yaml" <<EOF
model: ./bench/gpu_models.py:gpt
data: ./bench/gpu_models.py:growing_tokens
model_args: {max_len: 5120}
data_args: {short: 512, long: 5120, short_count: 320}
project_dir: $PWD
device: cuda
precision: bf16
batch_size: 16
effective_batch_size: 16
steps: 40
log_every_steps: 5
checkpoint_every_s: 0
render_plots: false
cache_dir: $R/cache
out_dir: $R/oom_midrun
EOF

run() {  # name, then the command; wall time and exit code go to $R/NAME.rc
    local name=$1
    shift
    local start=$SECONDS
    "$@" >"$R/$name.out" 2>"$R/$name.err"
    echo "$? $((SECONDS - start))" >"$R/$name.rc"
}

common=(--set device=cuda --set render_plots=false --set "cache_dir=$R/cache")
run bf16 "$PY" -m trainer train --config digits --set precision=bf16 "${common[@]}" --set "out_dir=$R/bf16"
run auto "$PY" -m trainer train --config digits --set precision=auto "${common[@]}" --set "out_dir=$R/auto"
run find_batch "$PY" -m trainer find-batch --config "$R/find_batch.yaml" --json --no-cache
run find_batch_cached "$PY" -m trainer find-batch --config "$R/find_batch.yaml" --json
run oom_midrun "$PY" -m trainer train --config "$R/oom_midrun.yaml"

"$PY" - "$R" <<'EOF'
import json, sys
from pathlib import Path

from trainer.run_folder import METRICS, SUMMARY  # run from the repository root

r = Path(sys.argv[1])

def rc(name):
    code, secs = (r / f"{name}.rc").read_text().split()
    return f"exit {code}, {secs} s"

def summary(run):
    p = r / run / SUMMARY
    return json.loads(p.read_text()) if p.is_file() else {}

def metrics(run):
    p = r / run / METRICS
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()] if p.is_file() else []

def nvml(run):
    m = metrics(run)
    util = [x["gpu_util"] for x in m if x.get("gpu_util") is not None]
    mem = [x["gpu_mem_gb"] for x in m if x.get("gpu_mem_gb") is not None]
    if not m:
        return "no metrics"
    return (f"{len(util)}/{len(m)} lines with gpu_util (max {max(util, default=0):.0f}%), "
            f"{len(mem)}/{len(m)} with gpu_mem_gb (max {max(mem, default=0):.2f} GB)")

def found(name):
    try:
        return json.loads((r / f"{name}.out").read_text())
    except (OSError, ValueError):
        return {}

rows = []
for run in ("bf16", "auto"):
    s = summary(run)
    rows.append((f"digits, precision {run}", rc(run),
                 f"precision {s.get('precision')}, acc {s.get('accuracy')}, "
                 f"{s.get('samples_per_s') or 0:,.0f} samples/s, status {s.get('status')}"))
f = found("find_batch")
rows.append(("find-batch, real OOM (GPT T=2048)", rc("find_batch"),
             f"largest fit {f.get('max_micro_batch')}, limited by {f.get('limited_by')}, "
             f"margin {f.get('margin')} -> use {f.get('usable_micro_batch')}, "
             f"trials {' '.join(f'{s}' + ('' if ok else '!') for s, ok in f.get('trials', []))} (! = OOM)"))
c = found("find_batch_cached")
rows.append(("find-batch again (cache)", rc("find_batch_cached"),
             f"from_cache {c.get('from_cache')}, largest fit {c.get('max_micro_batch')}, "
             f"use {c.get('usable_micro_batch')}"))
s = summary("oom_midrun")
rows.append(("OOM mid-run (T 512 -> 5120 at step 20)", rc("oom_midrun"),
             f"status {s.get('status')}, steps {s.get('steps')}, oom_fallbacks {s.get('oom_fallbacks')}, "
             f"micro {s.get('micro_batch')} x accum {s.get('accum_steps')} = global {s.get('global_batch')}"))
for run in ("bf16", "oom_midrun"):
    rows.append((f"NVML in {run}/metrics.jsonl", "", nvml(run)))

print()
print((r / "env.txt").read_text().strip())
print("| check | process | result |")
print("| --- | --- | --- |")
for row in rows:
    print("| " + " | ".join(row) + " |")
EOF
