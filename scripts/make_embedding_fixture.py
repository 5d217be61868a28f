#!/usr/bin/env python3
"""Builds the tiny Qwen3-Embedding-style fixture kiln's embedding tests compare against.

Run from the repository root on a machine with PyTorch, transformers (5.x),
tokenizers and sentence-transformers:

    python3 scripts/make_embedding_fixture.py --out testdata/fixtures/qwen3-embedding

It lays out a directory as Qwen/Qwen3-Embedding-* ship theirs:

    config.json                 architectures Qwen3ForCausalLM, float32
    model.safetensors           the bare transformer (Qwen3Model): no "model." prefix, no LM head
    tokenizer.json              the qwen3 fixture's tokenizer, its post-processor appending <|endoftext|>
    tokenizer_config.json       padding_side left, pad_token <|endoftext|>
    modules.json                Transformer, Pooling (1_Pooling), Normalize (2_Normalize)
    1_Pooling/config.json       pooling_mode_lasttoken
    sentence_bert_config.json   max_seq_length (small here, so that truncation is exercised)
    config_sentence_transformers.json   Qwen3-Embedding's query prompt, cosine similarity

The model has random weights (seeded) and the qwen3 fixture's shapes and
tokenizer. The directory is then loaded back with
sentence_transformers.SentenceTransformer on the CPU in float32, the way a
user loads Qwen3-Embedding, and the embeddings of a few inputs are written to
reference.json: each input's text as kiln receives it (a prompt already
prepended), the token ids sentence-transformers fed the model, whether the
input was truncated to max_seq_length, the embedding, and the embedding
truncated to 16 dimensions and normalised again (OpenAI's "dimensions").
Each input is encoded alone (batch_size=1, no padding); the script checks
that a left-padded batch gives the same vectors to 1e-5.
"""

import argparse
import json
import os
import shutil
import sys

import numpy as np
import torch
import transformers
from sentence_transformers import SentenceTransformer
from tokenizers import Tokenizer, processors

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import BASE  # noqa: E402  the fixtures' shapes

QUERY_PROMPT = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
MAX_SEQ_LENGTH = 128
DIMS = 16
INPUTS = [
    ("Hello world", None),
    ("The quick brown fox jumps over the lazy dog.", None),
    ("What is the capital of France?", "query"),
    ("Return a new list containing all items from the iterable in ascending order.", "document"),
    ("café naïve — 東京 🙂", None),
    ("a", None),
    (" ".join(["Encode the string using the codec registered for encoding."] * 20), None),  # truncated
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="testdata/fixtures/qwen3-embedding")
    ap.add_argument("--tokenizer", default="testdata/fixtures/qwen3", help="the fixture whose tokenizer to use")
    args = ap.parse_args()
    out = args.out
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(os.path.join(out, "1_Pooling"))
    torch.manual_seed(20261124)

    # Tokenizer: the fixture's, appending <|endoftext|> as Qwen3-Embedding's does.
    tok = Tokenizer.from_file(os.path.join(args.tokenizer, "tokenizer.json"))
    eot = tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(
        single="$A:0 <|endoftext|>:0",
        pair="$A:0 <|endoftext|>:0 $B:1 <|endoftext|>:1",
        special_tokens=[("<|endoftext|>", eot)],
    )
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(args.tokenizer, "tokenizer_config.json")) as f:
        tcfg = json.load(f)
    tcfg.update({"padding_side": "left", "pad_token": "<|endoftext|>", "eos_token": "<|im_end|>"})
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(tcfg, f, indent=2)

    # Model: a tiny Qwen3 with random weights, every norm perturbed too.
    assert tok.get_vocab_size() == BASE["vocab_size"]
    cfg = transformers.Qwen3Config(
        **BASE,
        intermediate_size=128,
        num_hidden_layers=3,
        tie_word_embeddings=True,
        initializer_range=0.1,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        eos_token_id=eot,
        bos_token_id=eot,
    )
    model = transformers.Qwen3Model(cfg).to(torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
    model.save_pretrained(out, safe_serialization=True)
    with open(os.path.join(out, "config.json")) as f:
        mcfg = json.load(f)
    mcfg["architectures"] = ["Qwen3ForCausalLM"]  # what Qwen3-Embedding's config.json says
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(mcfg, f, indent=2)

    # sentence-transformers modules, as Qwen3-Embedding has them.
    files = {
        "modules.json": [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
        ],
        "1_Pooling/config.json": {
            "word_embedding_dimension": cfg.hidden_size,
            "pooling_mode_cls_token": False,
            "pooling_mode_mean_tokens": False,
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
            "pooling_mode_weightedmean_tokens": False,
            "pooling_mode_lasttoken": True,
            "include_prompt": True,
        },
        "sentence_bert_config.json": {"max_seq_length": MAX_SEQ_LENGTH, "do_lower_case": False},
        "config_sentence_transformers.json": {
            "prompts": {"query": QUERY_PROMPT, "document": ""},
            "default_prompt_name": None,
            "similarity_fn_name": "cosine",
        },
    }
    for name, value in files.items():
        with open(os.path.join(out, name), "w") as f:
            json.dump(value, f, indent=2)

    # The reference: loaded back as users load Qwen3-Embedding.
    st = SentenceTransformer(out, device="cpu", model_kwargs={"dtype": torch.float32})
    st.eval()
    assert st.max_seq_length == MAX_SEQ_LENGTH, st.max_seq_length
    cases = []
    for text, prompt_name in INPUTS:
        full = (st.prompts.get(prompt_name, "") if prompt_name else "") + text
        # The ids sentence-transformers' Transformer module feeds the model.
        ids = st.tokenizer([full], padding=True, truncation="longest_first", max_length=st.max_seq_length)["input_ids"][0]
        ids = [int(i) for i in ids]
        assert ids[-1] == eot, f"sentence-transformers did not append <|endoftext|> to {full!r}: {ids[-5:]}"
        untruncated = tok.encode(full).ids
        emb = st.encode([text], prompt_name=prompt_name, batch_size=1, convert_to_numpy=True)[0].astype(np.float64)
        short = st.encode([text], prompt_name=prompt_name, batch_size=1, convert_to_numpy=True, truncate_dim=DIMS)[0].astype(np.float64)
        short = short / max(np.linalg.norm(short), 1e-12)
        assert abs(np.linalg.norm(emb) - 1) < 1e-5
        cases.append({
            "input": full,
            "ids": ids,
            "truncated": len(untruncated) > len(ids),
            "embedding": [float(x) for x in emb],
            "embedding_%d" % DIMS: [float(x) for x in short],
        })
    # A left-padded batch gives the same vectors.
    texts = [c["input"] for c in cases]
    batch = st.encode(texts, batch_size=len(texts), convert_to_numpy=True)
    for c, b in zip(cases, batch):
        diff = np.abs(np.array(c["embedding"]) - b).max()
        assert diff < 1e-5, f"batched differs by {diff} for {c['input'][:40]!r}"
    assert any(c["truncated"] for c in cases)
    ref = {
        "note": "sentence_transformers.SentenceTransformer(dir).encode on the CPU in float32, one input at a time",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "sentence_transformers": __import__("sentence_transformers").__version__},
        "max_seq_length": MAX_SEQ_LENGTH,
        "dimensions": DIMS,
        "cases": cases,
    }
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)

    size = sum(os.path.getsize(os.path.join(d, n)) for d, _, ns in os.walk(out) for n in ns)
    print(f"wrote {out}: {size} bytes, {len(cases)} reference embeddings")
    if size >= 1 << 20:
        sys.exit(f"the fixture is {size} bytes, over 1 MB")


if __name__ == "__main__":
    main()
