#!/usr/bin/env bash
# The example models end to end on the command line: train -> record -> analyze -> causal -> verdict -> report.
# torch and tl are trained on the query state's value; decoy is torch_model.py trained on its immediate
# reward (no RL algorithm: the toolkit must not call it TD).
#
#   examples/run_all.sh [OUT]             # full size: OUT (default example-runs)
#   STEPS=5 TASKS=256 examples/run_all.sh /tmp/quick   # a smoke test
#   MODELS=tl examples/run_all.sh OUT     # one model only (any of "torch tl decoy")
#
# examples/run_all.py does the same through the Python API. Run from anywhere; paths are relative to
# the repository root, and the commands come from .venv (override with BIN=...).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
OUT=${1:-example-runs}
STEPS=${STEPS:-1200}        # training steps per model (batch 256, fresh tasks every step)
TASKS=${TASKS:-2048}        # prompts recorded per model
CAUSAL_TASKS=${CAUSAL_TASKS:-256}
THREADS=${THREADS:-1}       # torch threads for training: one is fastest for these tiny products on a busy box
MODELS=${MODELS:-torch tl decoy}  # which example models
TASK=(--task linear-td --d 4 --n 30 --n-layers 3)   # the task the models are trained on
mkdir -p "$OUT"

REPORT_INPUTS=()
for X in $MODELS; do
  case "$X" in torch|tl) FILE=$X; TARGET=value;; decoy) FILE=torch; TARGET=reward;;
    *) echo "MODELS: unknown model '$X' (torch, tl, decoy)" >&2; exit 2;; esac
  PROBE=()
  if [ "$FILE" = torch ]; then PROBE=(--probe examples/torch_model.toml); fi   # TransformerLens needs none
  W="$OUT/${X}_model.safetensors"

  echo "== $X: train (target: $TARGET at the query state)"
  "$BIN/python" examples/train_example.py "$FILE" --target "$TARGET" --steps "$STEPS" --threads "$THREADS" \
      --out "$W" --json "$OUT/${X}_train.json"

  echo "== $X: record"
  rm -f "$OUT/$X.h5"   # record refuses to overwrite a recording
  "$BIN/icrl-interp" record --model "examples/${FILE}_model.py:make" --weights "$W" "${TASK[@]}" \
      ${PROBE[@]+"${PROBE[@]}"} --tasks "$TASKS" --out "$OUT/$X.h5" --no-progress

  echo "== $X: analyze"
  "$BIN/icrl-interp" analyze "$OUT/$X.h5" --json "$OUT/$X.json"

  # Layer 0: the test edits the context columns of the residual stream; after the last layer no
  # attention reads them any more, so an edit there cannot reach the output at the query. The same
  # test runs on the random-init copy, and the table ends with "exceeds random init (erasure): yes/no".
  echo "== $X: causal"
  "$BIN/icrl-interp" causal --model "examples/${FILE}_model.py:make" --weights "$W" "${TASK[@]}" \
      ${PROBE[@]+"${PROBE[@]}"} --layer 0 --tasks "$CAUSAL_TASKS" \
      --json "$OUT/${X}_causal.json" --figure "$OUT/${X}_causal.png"

  # Which candidate algorithm the recorded model runs (behaviour and probes; docs/verdict.md). The report
  # pairs X_verdict.json with X_causal.json by name and opens with both answers.
  echo "== $X: verdict"
  "$BIN/icrl-interp" verdict "$OUT/$X.h5" --json "$OUT/${X}_verdict.json" --figure "$OUT/${X}_verdict.png"
  REPORT_INPUTS+=("$OUT/$X.h5" "$OUT/${X}_causal.json" "$OUT/${X}_verdict.json")
done

echo "== report"
"$BIN/icrl-interp" report "${REPORT_INPUTS[@]}" --out "$OUT/report" --no-progress
