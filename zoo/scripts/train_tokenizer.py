#!/usr/bin/env python3
"""Train the zoo's byte-level BPE tokenizer (HF `tokenizers`) on data/corpus/train_*.txt.

Saves tokenizer.json + tokenizer_config.json + special_tokens_map.json into --out so that
`transformers.AutoTokenizer.from_pretrained(out)` works offline.  `<|endoftext|>` is the
bos, eos, pad and unk token (GPT-2 style); it also separates documents in the corpus.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

ROOT = Path(__file__).resolve().parents[2]
EOT = "<|endoftext|>"


def iter_docs(files, chunk_chars=1 << 16):
    for fn in files:
        text = Path(fn).read_text(encoding="utf-8")
        for doc in text.split(EOT):
            for i in range(0, len(doc), chunk_chars):
                yield doc[i:i + chunk_chars]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--corpus", default=str(ROOT / "data" / "corpus"))
    ap.add_argument("--out", default=str(ROOT / "zoo" / "build" / "tokenizer"))
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--min-frequency", type=int, default=2)
    args = ap.parse_args()

    files = sorted(glob.glob(os.path.join(args.corpus, "train_*.txt")))
    if not files:
        raise SystemExit(f"no train_*.txt in {args.corpus}; run prepare_data.py first")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=args.vocab_size, min_frequency=args.min_frequency,
                                  special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(iter_docs(files), trainer=trainer)
    assert tok.token_to_id(EOT) == 0

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOT, "eos_token": EOT, "unk_token": EOT, "pad_token": EOT,
        "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
        "model_max_length": 2048, "padding_side": "left",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": EOT, "eos_token": EOT, "unk_token": EOT, "pad_token": EOT}, indent=2) + "\n")

    sample = "def hello(name):\n    \"\"\"Greet.\"\"\"\n    return f'hi {name}'\n"
    ids = tok.encode(sample).ids
    assert tok.decode(ids) == sample, "round trip failed"
    print(f"vocab={tok.get_vocab_size()} saved to {out}; sample: {len(sample)} chars -> {len(ids)} tokens")


if __name__ == "__main__":
    main()
