#!/usr/bin/env bash
# Train the zoo's target and distilled draft on one GPU, from the pre-tokenized corpus.
#
# Needs (carried with the working tree): zoo/build/tokens/{train,eval}.bin,meta.json and
# zoo/build/tokenizer/ (made by prepare_data.py, train_tokenizer.py, tokenize_corpus.py).
# No network, no pip: python3 with torch, transformers, tokenizers, safetensors, tqdm, numpy.
#
# Writes to $OUT (default ./gpu_out), at most 6 flat files, each < 16 MiB:
#   zoo_models.tar.part-aa, -ab, -ac   the two HF folders target/ and draft/ (tar, split at 15 MiB)
#   zoo_models.sha256                  checksum of the whole tar
#   train_log.json                     loss curves + final evals of both models
#   summary.txt                        human-readable summary + greedy samples
# Reassemble here with:  bash zoo/scripts/unpack_gpu_out.sh $OUT
#
# Env: TARGET_S (default 240) and DRAFT_S (default 120) wall budgets in seconds; SMOKE=1 runs a
# tiny 20-step version of everything (works on CPU) to test the pipeline end to end.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
OUT=${OUT:-$PWD/gpu_out}
B=zoo/build
WORK=${WORK:-$(mktemp -d /tmp/lightspec_zoo_gpu.XXXXXX)}
mkdir -p "$OUT" "$WORK"
for f in $B/tokens/train.bin $B/tokens/eval.bin $B/tokenizer/tokenizer.json; do
  [ -f "$f" ] || { echo "missing $f (carry zoo/build/tokens and zoo/build/tokenizer)"; exit 2; }
done
$PY - <<'PYEOF'
import torch, transformers, tokenizers, platform
print(f"python {platform.python_version()} torch {torch.__version__} transformers {transformers.__version__} "
      f"tokenizers {tokenizers.__version__} cuda {torch.cuda.is_available()} "
      f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else ''}", flush=True)
PYEOF

if [ "${SMOKE:-0}" = "1" ]; then
  T_ARGS="--preset tiny --ctx 64 --batch-size 4 --max-steps 20 --eval-every 10 --eval-tokens 4096 --final-eval-tokens 8192"
  D_ARGS="--preset tiny --hidden 32 --layers 1 --heads 1 --kv-heads 1 --intermediate 64 --ctx 64 --batch-size 4 --max-steps 20 --eval-every 10 --eval-tokens 4096 --final-eval-tokens 8192"
else
  T_ARGS="--preset target --ctx 512 --batch-size 64 --lr 1.5e-3 --warmup 200 --time-budget-s ${TARGET_S:-240} \
    --eval-every 250 --eval-tokens 131072 --final-eval-tokens 0 --keep-best"
  D_ARGS="--preset draft --ctx 512 --batch-size 64 --lr 3e-3 --warmup 100 --time-budget-s ${DRAFT_S:-120} \
    --eval-every 250 --eval-tokens 131072 --final-eval-tokens 0 --keep-best"
fi
COMMON="--data $B/tokens --tokenizer $B/tokenizer --ckpt-every 1000000 --ckpt-every-s 100000"
# progress bars only on a terminal (keeps captured logs short); PROGRESS=1 forces them
if [ ! -t 2 ] && [ "${PROGRESS:-0}" != "1" ]; then COMMON="$COMMON --no-progress"; fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

echo "== target"; date
$PY zoo/scripts/train.py $COMMON $T_ARGS --name target --out "$WORK/models/target" \
  --ckpt-dir "$WORK/ckpt/target" --log-json "$WORK/target_log.json"
echo "== draft (distilled from target)"; date
$PY zoo/scripts/train.py $COMMON $D_ARGS --name draft --distill-from "$WORK/models/target" \
  --out "$WORK/models/draft" --ckpt-dir "$WORK/ckpt/draft" --log-json "$WORK/draft_log.json"
date

# checks + samples, then pack
$PY - "$WORK" "$OUT" <<'PYEOF'
import json, sys, os, torch
from transformers import AutoTokenizer, AutoModelForCausalLM
work, out = sys.argv[1], sys.argv[2]
logs = {m: json.load(open(f"{work}/{m}_log.json")) for m in ("target", "draft")}
json.dump(logs, open(f"{out}/train_log.json", "w"))
lines = []
dev = "cuda" if torch.cuda.is_available() else "cpu"
tok = AutoTokenizer.from_pretrained(f"{work}/models/target")
for m in ("target", "draft"):
    L = logs[m]
    model = AutoModelForCausalLM.from_pretrained(f"{work}/models/{m}", dtype=torch.float32).to(dev).eval()
    fe = L["final_eval"]
    lines.append(f"{m}: {L['params']:,} params, {L['state']['step']} steps, {L['state']['tokens']:,} tokens, "
                 f"{L['state']['elapsed']:.0f} s on {L['device']}; held-out loss {fe['loss']:.4f} ppl {fe['ppl']:.2f}"
                 + (f", top-1 agreement with target {fe['top1_agreement_with_teacher']:.3f}"
                    if "top1_agreement_with_teacher" in fe else ""))
    for p in ["def fibonacci(n):\n", "import os\n\ndef list_files(path):\n", "HAMLET.\n"]:
        x = tok(p, return_tensors="pt").to(dev)
        y = model.generate(**x, max_new_tokens=48, do_sample=False)
        lines.append(f"--- {m} greedy: {tok.decode(y[0])!r}")
open(f"{out}/summary.txt", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PYEOF
tar -C "$WORK/models" -cf "$WORK/zoo_models.tar" target draft
( cd "$WORK" && sha256sum zoo_models.tar ) > "$OUT/zoo_models.sha256"
split -b "${SPLIT:-15M}" -a 2 "$WORK/zoo_models.tar" "$OUT/zoo_models.tar.part-"
ls -la "$OUT"
n=$(ls "$OUT" | wc -l); [ "$n" -le 8 ] || { echo "too many output files: $n"; exit 3; }
echo "done; unpack with: bash zoo/scripts/unpack_gpu_out.sh <dir with these files>"
