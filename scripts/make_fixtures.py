#!/usr/bin/env python3
"""Builds the tiny reference models kiln's model tests compare against.

Run on a machine with PyTorch, transformers (5.x) and tokenizers:

    python3 scripts/make_fixtures.py --out testdata/fixtures

For each architecture of the Qwen3 family it trains a small byte-level BPE
tokenizer (Qwen's pre-tokenizer regex), builds a tiny model with random
weights, trains it for a few hundred steps on text (so that greedy
continuations have a margin), and saves it as bf16 safetensors with
tokenizer.json, tokenizer_config.json and generation_config.json under
<out>/<name>/. Reference outputs are computed in fp32 on the CPU from the saved
bf16 weights (reloaded and upcast), with the eager attention path and full
recomputation at every greedy step (no cache), and written beside the model:

    reference.json   prompts, per-position argmax and top-2 margins, 32-token
                     greedy continuations with the margin at every step
    ref_logits.f32   last-position logits of each prompt, [prompts, vocab],
                     little-endian float32

It also writes <out>/rope_yarn.json: YaRN inverse frequencies and attention
factors computed by transformers for a few configs.

Architectures transformers cannot build are skipped and reported.
"""

import argparse
import importlib
import json
import math
import os
import random
import sys
import time
import traceback

import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast

VOCAB = 512
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2/Qwen3's pre-tokenizer split.
SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
GREEDY = 32
TRAIN_STEPS = 400
SEQ = 128
BATCH = 32

# Shared tiny shapes.
BASE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rms_norm_eps=1e-6,
    max_position_embeddings=4096,
    hidden_act="silu",
)
LINEAR = dict(
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
)
MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)


def corpus():
    """English text from the docstrings of the Python standard library."""
    names = [
        "os", "json", "collections", "argparse", "re", "functools", "itertools", "pathlib",
        "subprocess", "threading", "logging", "unittest", "email", "http.client", "urllib.request",
        "csv", "datetime", "decimal", "fractions", "heapq", "inspect", "shutil", "socket", "string",
        "textwrap", "tempfile", "typing", "zipfile", "tarfile", "asyncio", "calendar", "difflib",
        "random", "statistics", "struct", "io", "codecs", "pickle", "sqlite3", "ssl",
    ]
    parts = []
    for name in names:
        try:
            m = importlib.import_module(name)
        except Exception:
            continue
        if m.__doc__:
            parts.append(m.__doc__)
        for attr in sorted(dir(m)):
            if attr.startswith("_"):
                continue
            doc = getattr(getattr(m, attr, None), "__doc__", None)
            if isinstance(doc, str) and len(doc) > 120:
                parts.append(doc)
    seen, out = set(), []
    for p in parts:
        if p not in seen:
            seen.add(p)
            out.append(p.strip())
    return out


def train_tokenizer(texts):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - len(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    # Special tokens after the learned vocabulary, as in Qwen's tokenizers.
    tok.add_special_tokens(SPECIALS)
    assert tok.get_vocab_size() <= VOCAB, tok.get_vocab_size()
    return tok


def fixtures():
    """(name, builder) pairs; a builder returns (model, save_class)."""
    T = transformers

    def qwen3():
        cfg = T.Qwen3Config(
            **BASE,
            intermediate_size=128,
            num_hidden_layers=3,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        )
        return T.Qwen3ForCausalLM(cfg)

    def qwen3moe():
        cfg = T.Qwen3MoeConfig(
            **BASE,
            **MOE,
            intermediate_size=128,
            num_hidden_layers=3,
            mlp_only_layers=[1],
            decoder_sparse_step=1,
            norm_topk_prob=False,
            tie_word_embeddings=False,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        )
        return T.Qwen3MoeForCausalLM(cfg)

    def qwen3next():
        cfg = T.Qwen3NextConfig(
            **{**BASE, "head_dim": 32},
            **LINEAR,
            **MOE,
            shared_expert_intermediate_size=32,
            intermediate_size=128,
            num_hidden_layers=4,
            layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
            mlp_only_layers=[2],
            norm_topk_prob=True,
            tie_word_embeddings=False,
        )
        return T.Qwen3NextForCausalLM(cfg)

    def qwen35_text(moe):
        kw = dict(
            **{**BASE, "head_dim": 32},
            **LINEAR,
            num_hidden_layers=4 if not moe else 3,
            tie_word_embeddings=False,
        )
        if moe:
            kw.update(MOE, shared_expert_intermediate_size=32)
            kw["layer_types"] = ["linear_attention", "full_attention", "linear_attention"]
        else:
            kw.update(intermediate_size=128)
            kw["layer_types"] = ["linear_attention", "linear_attention", "full_attention", "linear_attention"]
        return kw

    def qwen35():
        return T.Qwen3_5ForCausalLM(T.Qwen3_5TextConfig(**qwen35_text(False)))

    def qwen35moe():
        return T.Qwen3_5MoeForCausalLM(T.Qwen3_5MoeTextConfig(**qwen35_text(True)))

    def qwen35vl():
        text = qwen35_text(False)
        text["num_hidden_layers"] = 2
        text["layer_types"] = ["linear_attention", "full_attention"]
        vision = dict(
            depth=1,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            patch_size=4,
            spatial_merge_size=2,
            temporal_patch_size=2,
            out_hidden_size=64,
            num_position_embeddings=16,
        )
        cfg = T.Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=False)
        return T.Qwen3_5ForConditionalGeneration(cfg)

    return [
        ("qwen3", qwen3),
        ("qwen3moe", qwen3moe),
        ("qwen3next", qwen3next),
        ("qwen35", qwen35),
        ("qwen35moe", qwen35moe),
        ("qwen35vl", qwen35vl),
    ]


def train(model, data, device, log):
    model.to(device=device, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=TRAIN_STEPS, pct_start=0.1)
    g = torch.Generator().manual_seed(1)
    t0 = time.time()
    for step in range(TRAIN_STEPS):
        starts = torch.randint(0, data.numel() - SEQ - 1, (BATCH,), generator=g)
        x = torch.stack([data[s : s + SEQ] for s in starts.tolist()]).to(device)
        out = model(input_ids=x, labels=x, use_cache=False)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0 or step == TRAIN_STEPS - 1:
            log(f"  step {step} loss {out.loss.item():.3f} ({time.time() - t0:.1f}s)")
    model.eval()


@torch.no_grad()
def reference(model, prompts):
    out, last_logits = [], []
    for ids in prompts:
        logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
        top2 = logits.topk(2, dim=-1)
        seq, greedy, gmargins = list(ids), [], []
        for _ in range(GREEDY):
            step = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].float()
            t = step.topk(2)
            greedy.append(int(t.indices[0]))
            gmargins.append(float(t.values[0] - t.values[1]))
            seq.append(greedy[-1])
        last_logits.append(logits[-1])
        out.append(
            {
                "ids": ids,
                "argmax": top2.indices[:, 0].tolist(),
                "margins": (top2.values[:, 0] - top2.values[:, 1]).tolist(),
                "greedy": greedy,
                "greedy_margins": gmargins,
                "max_abs_logit": float(logits[-1].abs().max()),
            }
        )
    return out, torch.stack(last_logits)


def tensor_names(path):
    from safetensors import safe_open

    names = {}
    for f in sorted(os.listdir(path)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(path, f), "pt") as st:
                for k in st.keys():
                    names[k] = list(st.get_slice(k).get_shape())
    return names


def yarn_cases():
    """YaRN parameters as transformers computes them, for the Go config tests."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    T = transformers
    cases = [
        (
            "qwen3-yarn4",
            T.Qwen3Config(
                hidden_size=1024, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                max_position_embeddings=131072,
                rope_parameters={"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                                 "original_max_position_embeddings": 32768},
            ),
        ),
        (
            "qwen3-yarn-betas-attn",
            T.Qwen3Config(
                hidden_size=512, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
                max_position_embeddings=65536,
                rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0,
                                 "original_max_position_embeddings": 4096, "beta_fast": 16.0,
                                 "beta_slow": 2.0, "attention_factor": 1.25},
            ),
        ),
        (
            "qwen3next-yarn-partial",
            T.Qwen3NextConfig(
                hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                num_hidden_layers=4, max_position_embeddings=262144,
                rope_parameters={"rope_type": "yarn", "rope_theta": 10000000.0, "factor": 4.0,
                                 "original_max_position_embeddings": 65536, "partial_rotary_factor": 0.25},
            ),
        ),
    ]
    out = []
    for name, cfg in cases:
        cfg.architectures = [{"qwen3": "Qwen3ForCausalLM", "qwen3_next": "Qwen3NextForCausalLM"}[cfg.model_type]]
        inv_freq, attn = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
        out.append(
            {
                "name": name,
                "config": json.loads(cfg.to_json_string()),
                "inv_freq": inv_freq.float().tolist(),
                "attention_factor": float(attn),
            }
        )
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="", help="comma-separated fixture names")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    random.seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"

    def log(s):
        print(s, flush=True)

    log(f"torch {torch.__version__} transformers {transformers.__version__} device {device}")
    texts = corpus()
    tok = train_tokenizer(texts)
    text = "\n\n".join(texts)
    data = torch.tensor(tok.encode(text).ids, dtype=torch.long)
    log(f"corpus {len(text)} chars, {data.numel()} tokens, vocab {tok.get_vocab_size()}")

    prompt_texts = [
        "The quick brown fox",
        "Return a new list containing all items from the iterable in ascending order.",
        "\n\n".join(texts[len(texts) // 2 : len(texts) // 2 + 8])[:4000],
    ]
    prompts = [tok.encode(t).ids for t in prompt_texts]
    prompts[2] = prompts[2][:260]
    prompts.append([tok.token_to_id("<|im_start|>")])
    assert len(prompts[2]) > 200, len(prompts[2])

    eos = tok.token_to_id("<|im_end|>")
    report = {}
    only = set(filter(None, args.only.split(",")))
    for name, build in fixtures():
        if only and name not in only:
            continue
        d = os.path.join(args.out, name)
        log(f"== {name}")
        try:
            torch.manual_seed(0)
            model = build()
            cls = type(model)
            train(model, data, device, log)
            model.to(device="cpu", dtype=torch.bfloat16)
            model.config.eos_token_id = eos
            model.save_pretrained(d)
            hf = PreTrainedTokenizerFast(
                tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>"
            )
            hf.chat_template = CHAT_TEMPLATE
            hf.save_pretrained(d)
            # One fixture says eos as an int, the others as a list.
            gen_eos = eos if name == "qwen3" else [eos, tok.token_to_id("<|endoftext|>")]
            GenerationConfig(
                eos_token_id=gen_eos, do_sample=True, temperature=0.7, top_p=0.8, top_k=20
            ).save_pretrained(d)
            del model
            ref = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
            ref.eval()
            torch.set_num_threads(os.cpu_count() or 4)
            refs, last = reference(ref, prompts)
            with open(os.path.join(d, "ref_logits.f32"), "wb") as f:
                f.write(last.contiguous().numpy().astype("<f4").tobytes())
            names = tensor_names(d)
            with open(os.path.join(d, "reference.json"), "w") as f:
                json.dump(
                    {
                        "architecture": cls.__name__,
                        "transformers": transformers.__version__,
                        "torch": torch.__version__,
                        "vocab_size": last.shape[1],
                        "prompts": refs,
                    },
                    f,
                )
            mins = [min(r["greedy_margins"]) for r in refs]
            log(f"  saved {len(names)} tensors; greedy min margins {['%.3g' % m for m in mins]}")
            log("  tensors: " + ", ".join(f"{k}{v}" for k, v in list(names.items())[:60]))
            report[name] = "ok"
        except Exception as e:
            traceback.print_exc()
            report[name] = f"skipped: {type(e).__name__}: {e}"
            log(f"  {report[name]}")
    try:
        with open(os.path.join(args.out, "rope_yarn.json"), "w") as f:
            json.dump({"transformers": transformers.__version__, "cases": yarn_cases()}, f)
        report["rope_yarn"] = "ok"
    except Exception as e:
        traceback.print_exc()
        report["rope_yarn"] = f"skipped: {e}"
    log("REPORT " + json.dumps(report))


if __name__ == "__main__":
    main()
