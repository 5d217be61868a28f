#!/usr/bin/env python3
"""Builds the quantized fixtures kiln's loaders are checked against.

Run on the GPU machine (PyTorch, transformers 5.x, llama.cpp's source unpacked at $LLSRC):

    LLSRC=/tmp/ll/llsrc python3 scripts/make_quant_fixtures.py --out OUT

1. FP8: every fixture of testdata/fixtures re-saved the way Qwen's -FP8 repositories are: each
   linear layer's weight as float8_e4m3fn with weight_scale_inv holding amax/448 of each 128x128
   tile (bf16 for Qwen3.5, f32 otherwise), everything else as it was, and a quantization_config.
   Written to OUT/fp8-<name>/ with ref_logits.f32: transformers fp32 on the weights dequantized
   exactly (weight * scale), for the fixture's prompts. transformers 5 holds MoE experts fused,
   so the per-expert weights replaced here miss them: for the MoE fixtures the reference keeps
   bf16 experts, and kiln's tests check those against kiln's own exact dequantization instead. transformers' own FP8 loader
   (FineGrainedFP8Config(dequantize=True)) is tried too and its distance reported.
2. GGUF: llama.cpp's converter turns fixtures into F32 GGUF files, OUT/<name>-f32.gguf, which
   llama-quantize (on any machine) makes Q8_0, Q4_K_M, ... from. The trained fixtures are 64 wide,
   too narrow for the K-quants' 256-element blocks, so random-weight models 256 wide are made too
   (OUT/hf-<name>-w256/ and OUT/<name>-w256-f32.gguf).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import traceback

import torch
import transformers
from safetensors.torch import load_file, save_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "testdata", "fixtures")
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
          "in_proj_qkvz", "in_proj_qkv", "in_proj_z", "out_proj", "gate_up_proj")


def is_linear(name, t):
    parts = name.split(".")
    return t.dim() == 2 and parts[-1] == "weight" and len(parts) > 1 and parts[-2] in LINEAR


def fp8_tiles(w):
    """e4m3 weight and amax/448 per 128x128 tile, as Qwen's FP8 checkpoints hold them."""
    r, c = w.shape
    tr, tc = (r + 127) // 128, (c + 127) // 128
    pad = torch.zeros(tr * 128, tc * 128, dtype=torch.float32)
    pad[:r, :c] = w.float()
    tiles = pad.view(tr, 128, tc, 128)
    amax = tiles.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    q = (tiles / scale[:, None, :, None]).to(torch.float8_e4m3fn)
    deq = (q.float() * scale[:, None, :, None]).view(tr * 128, tc * 128)[:r, :c]
    return q.view(tr * 128, tc * 128)[:r, :c].contiguous(), scale, deq


def prompts_of(name):
    ref = json.load(open(os.path.join(FIX, name, "reference.json")))
    return [p["ids"] for p in ref["prompts"]]


@torch.no_grad()
def last_logits(model, prompts):
    out = []
    for ids in prompts:
        out.append(model(torch.tensor([ids])).logits[0, -1].float())
    return torch.stack(out)


def load_model(d, **kw):
    cfg = transformers.AutoConfig.from_pretrained(d)
    arch = cfg.architectures[0]
    cls = getattr(transformers, arch)
    return cls.from_pretrained(d, attn_implementation="eager", **kw).eval()


def make_fp8(name, out):
    src = os.path.join(FIX, name)
    dst = os.path.join(out, "fp8-" + name)
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.safetensors", "ref_logits.f32"))
    weights = load_file(os.path.join(src, "model.safetensors"))
    cfg = json.load(open(os.path.join(src, "config.json")))
    scale_dtype = torch.bfloat16 if cfg["architectures"][0].startswith("Qwen3_5") else torch.float32
    saved, dequant = {}, {}
    for k, t in weights.items():
        if is_linear(k, t) and t.dim() == 2:
            q, s, deq = fp8_tiles(t)
            saved[k] = q
            saved[k + "_scale_inv"] = s.to(scale_dtype)
            dequant[k] = deq * (s.to(scale_dtype).float() / s).repeat_interleave(128, 0).repeat_interleave(128, 1)[:t.shape[0], :t.shape[1]]
        else:
            saved[k] = t
            dequant[k] = t.float()
    save_file(saved, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    qc = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    cfg["quantization_config"] = qc
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=2)
    # Reference: the bf16 fixture's model, its linear weights replaced by the dequantized FP8 ones, in fp32.
    model = load_model(src, dtype=torch.float32)
    sd = model.state_dict()
    for k, v in dequant.items():
        if k in sd:
            sd[k].copy_(v)
    model.load_state_dict(sd)
    logits = last_logits(model, prompts_of(name))
    logits.numpy().astype("<f4").tofile(os.path.join(dst, "ref_logits.f32"))
    note = ""
    try:
        fq = load_model(dst, dtype=torch.float32,
                        quantization_config=transformers.FineGrainedFP8Config(dequantize=True))
        hf = last_logits(fq, prompts_of(name))
        note = "transformers FineGrainedFP8Config(dequantize=True): relative L2 %.2e" % (
            ((hf - logits).norm() / logits.norm()).item())
    except Exception as e:  # report, not fail: the reference above does not need it
        note = "transformers FP8 loader failed: %s" % str(e).splitlines()[0][:200]
    print("fp8", name, note, flush=True)


W256 = {
    "qwen3": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64, tie_word_embeddings=False),
    "qwen3moe": dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=256, num_experts=4,
                     num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=64, norm_topk_prob=True, tie_word_embeddings=False),
    "qwen3next": dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=256,
                      shared_expert_intermediate_size=256, num_experts=4, num_experts_per_tok=2,
                      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                      linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=128,
                      linear_value_head_dim=128, full_attention_interval=2, tie_word_embeddings=False),
}


def make_w256(name, out):
    src = os.path.join(FIX, name)
    dst = os.path.join(out, "hf-%s-w256" % name)
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    cfg = json.load(open(os.path.join(src, "config.json")))
    for k in ("layer_types", "mlp_only_layers", "decoder_sparse_step"):
        cfg.pop(k, None)
    cfg.update(W256[name])
    cfg["initializer_range"] = 0.05  # logits that differ: std 0.02 gives nearly flat ones
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=2)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if os.path.exists(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), dst)
    torch.manual_seed(7)
    c = transformers.AutoConfig.from_pretrained(dst)
    model = getattr(transformers, c.architectures[0])(c).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("A_log"):
                p.copy_(torch.log(torch.empty_like(p).uniform_(1, 16)))
            elif "norm" in n and p.dim() == 1:
                p.copy_(torch.randn_like(p) * 0.1 + (0 if name == "qwen3next" else 1))
    model.save_pretrained(dst)
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=2)
    prompts = prompts_of(name)
    model = load_model(dst, dtype=torch.float32)
    last_logits(model, prompts).numpy().astype("<f4").tofile(os.path.join(dst, "ref_logits.f32"))
    json.dump({"prompts": [{"ids": p} for p in prompts]}, open(os.path.join(dst, "reference.json"), "w"))
    print("w256", name, "ok", flush=True)
    return dst


def to_gguf(src, dst, extra=()):
    here = os.path.dirname(os.path.abspath(__file__))
    conv = os.path.join(os.environ.get("PEERS", os.path.join(ROOT, "..", "shared", "peers")), "to_gguf.py")
    r = subprocess.run([sys.executable, conv, src, dst, "f32", *extra], capture_output=True, text=True)
    print("gguf", os.path.basename(dst), "ok" if r.returncode == 0 else "FAILED\n" + r.stderr[-2000:], flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for name in sorted(os.listdir(FIX)):
        if os.path.isdir(os.path.join(FIX, name)):
            try:
                make_fp8(name, a.out)
            except Exception:
                traceback.print_exc()
    for name in ("qwen3", "qwen3moe", "qwen3next"):
        extra = ("--no-mtp",) if name == "qwen3next" else ()
        try:
            to_gguf(os.path.join(FIX, name), os.path.join(a.out, name + "-f32.gguf"), extra)
            d = make_w256(name, a.out)
            to_gguf(d, os.path.join(a.out, name + "-w256-f32.gguf"), extra)
        except Exception:
            traceback.print_exc()


if __name__ == "__main__":
    main()
