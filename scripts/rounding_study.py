#!/usr/bin/env python3
"""Where bf16 rounding moves a Qwen3's logits: which of transformers' rounding
points kiln must share to land near transformers bf16.

Re-runs a dense Qwen3 forward in float32 (TF32 off) with the weights as
stored (bf16) and rounds to bf16 only at chosen points, then compares the
last-position logits (relative L2) with transformers bf16 and fp32, and with
kiln's own logits when given. The rounding points (on = as transformers bf16):

  resid   the residual stream after each add
  proj    the o and down products before they are added
  rope    RoPE in bf16: normed q/k rounded, cos/sin rounded, each product
          and the sum rounded (kiln: one rounding after RoPE in f32)
  silu    silu(gate) rounded before the product with up, which is rounded
  gu      the gate and up products rounded before SwiGLU
  normw   RMSNorm rounds x/rms before the weight and after it
  logits  the logits rounded
  mathattn  scores and softmax rounded (PyTorch's math attention); off:
          flash-style, P unnormalised and rounded before P.V

Usage (on the GPU machine):
  python3 scripts/rounding_study.py --model /tmp/qwen3-8b-synth [--kiln dir]
  python3 scripts/rounding_study.py --fixture testdata/fixtures/qwen3
--model is a directory of scripts/hf_reference.py (ref_logits.f32 is
transformers bf16, ref_logits_fp32.f32 fp32); --fixture one of
scripts/make_fixtures.py (ref_logits.f32 is fp32; transformers bf16 is
computed here). --kiln holds kiln_prefill.f32 / kiln_decode.f32.
"""
import argparse
import json
import os

import numpy as np
import torch
from transformers import AutoModelForCausalLM

POINTS = ["resid", "proj", "rope", "silu", "gu", "normw", "logits"]
KILN = {"gu"}  # where kiln's prefill rounds today, besides products and attention


def rel(a, b):
    return float((a - b).norm() / b.norm())


def forward(model, ids, on, round_all=True):
    def bf(x, point=None):
        if not round_all or (point is not None and point not in on):
            return x
        return x.bfloat16().float()

    c = model.config
    m = model.model
    hd = c.head_dim
    eps = c.rms_norm_eps
    T = len(ids)
    dev = m.embed_tokens.weight.device

    def lin(x, w):
        return x @ w.float().T

    def rms(x, w):
        r = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        if "normw" in on:
            return bf(w.float() * bf(r))
        return bf(r * w.float())

    theta = c.rope_parameters["rope_theta"]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).to(dev).float() / hd))
    ang = torch.arange(T, device=dev).float()[:, None] * inv[None]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None]

    def rot(x):
        h = x.shape[-1] // 2
        return torch.cat([-x[..., h:], x[..., :h]], -1)

    def norm_rope(x, w):
        r = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        if "rope" in on:
            x = bf(w.float() * bf(r))
            cs, sn = bf(cos), bf(sin)
            return bf(bf(x * cs) + bf(rot(x) * sn))
        x = r * w.float()
        return bf(x * cos + rot(x) * sin)

    x = m.embed_tokens.weight[ids].float()
    H, KH = c.num_attention_heads, c.num_key_value_heads
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=dev), 1)
    for layer in m.layers:
        a = layer.self_attn
        h = rms(x, layer.input_layernorm.weight)
        q = bf(lin(h, a.q_proj.weight)).view(T, H, hd)
        k = bf(lin(h, a.k_proj.weight)).view(T, KH, hd)
        v = bf(lin(h, a.v_proj.weight)).view(T, KH, hd)
        q, k = norm_rope(q, a.q_norm.weight), norm_rope(k, a.k_norm.weight)
        k, v = k.repeat_interleave(H // KH, 1), v.repeat_interleave(H // KH, 1)
        s = torch.einsum("thd,shd->hts", q, k) * hd**-0.5
        s = s.masked_fill(mask, float("-inf"))
        if "mathattn" in on:
            p = bf(torch.softmax(bf(s), -1))
            o = torch.einsum("hts,shd->thd", p, v)
        else:
            p = torch.exp(s - s.amax(-1, keepdim=True))
            l = p.sum(-1)
            o = torch.einsum("hts,shd->thd", bf(p), v) / l.T[..., None]
        o = bf(o).reshape(T, H * hd)
        x = bf(x + bf(lin(o, a.o_proj.weight), "proj"), "resid")
        h = rms(x, layer.post_attention_layernorm.weight)
        f = layer.mlp
        g, u = bf(lin(h, f.gate_proj.weight), "gu"), bf(lin(h, f.up_proj.weight), "gu")
        if "silu" in on:
            act = bf(bf(torch.nn.functional.silu(g)) * u)
        else:
            act = bf(torch.nn.functional.silu(g) * u)
        x = bf(x + bf(lin(act, f.down_proj.weight), "proj"), "resid")
    h = rms(x[-1:], m.norm.weight)
    return bf(lin(h, model.lm_head.weight), "logits")[0]


def variants():
    hf = set(POINTS)
    yield "kiln today", set(KILN)
    for p in POINTS:
        if p not in KILN:
            yield f"kiln + {p}", KILN | {p}
    yield "transformers", hf
    for p in POINTS:
        yield f"transformers - {p}", hf - {p}
    yield "transformers + mathattn", hf | {"mathattn"}
    yield "kiln + resid,proj", KILN | {"resid", "proj"}
    yield "kiln + resid,proj,rope", KILN | {"resid", "proj", "rope"}
    yield "kiln + resid,proj,rope,silu", KILN | {"resid", "proj", "rope", "silu"}
    yield "kiln + rope,silu,logits", KILN | {"rope", "silu", "logits"}


def self_consistency(model, prompt, hf16, hf32, dev):
    """transformers bf16 against itself: the same prompt through other but
    equally valid bf16 paths (other GEMM shapes, attention kernels, a cached
    decode step)."""
    ids = torch.tensor([prompt], device=dev)

    def last(**kw):
        return model(ids, logits_to_keep=1, **kw).logits[0, -1].float()

    runs = {"again (same path)": last()}
    runs["batch of 2 (other GEMM shapes)"] = model(ids.repeat(2, 1), logits_to_keep=1).logits[1, -1].float()
    out = model(ids[:, :-1], use_cache=True)
    runs["prefill n-1 + cached decode step"] = model(ids[:, -1:], past_key_values=out.past_key_values).logits[0, -1].float()
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    runs["no reduced-precision GEMM reductions"] = last()
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    model.set_attn_implementation("eager")
    runs["eager attention"] = last()
    model.set_attn_implementation("sdpa")
    print(f"transformers bf16 against its reference run (ref_logits.f32): bf16 vs fp32 {rel(hf16, hf32):.4f}")
    for name, y in runs.items():
        print(f"  {name:40} vs reference bf16 {rel(y, hf16):.4f}, vs fp32 {rel(y, hf32):.4f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--fixture")
    ap.add_argument("--kiln")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    d = args.model or args.fixture
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).to(dev).eval()
    if args.model:
        ref = json.load(open(os.path.join(d, "hf_reference.json")))
        prompts = [ref["prompt"]]
        hf16 = [torch.from_numpy(np.fromfile(os.path.join(d, "ref_logits.f32"), "<f4")).to(dev)]
        hf32 = [torch.from_numpy(np.fromfile(os.path.join(d, "ref_logits_fp32.f32"), "<f4")).to(dev)]
    else:
        ref = json.load(open(os.path.join(d, "reference.json")))
        prompts = [p["ids"] for p in ref["prompts"]]
        V = ref["vocab_size"]
        hf32 = list(torch.from_numpy(np.fromfile(os.path.join(d, "ref_logits.f32"), "<f4")).view(-1, V).to(dev))
        with torch.no_grad():
            hf16 = [model(torch.tensor([p], device=dev), logits_to_keep=1).logits[0, -1].float() for p in prompts]
    kiln = {}
    if args.kiln:
        for name in ("prefill", "decode"):
            f = os.path.join(args.kiln, f"kiln_{name}.f32")
            if os.path.exists(f):
                kiln[name] = torch.from_numpy(np.fromfile(f, "<f4")).to(dev)
    if args.model:
        with torch.no_grad():
            self_consistency(model, prompts[0], hf16[0], hf32[0], dev)
    with torch.no_grad():
        for i, p in enumerate(prompts):
            ids = torch.tensor(p, device=dev)
            f32 = forward(model, ids, set(), round_all=False)
            print(f"prompt {i} ({len(p)} tokens): emulation without rounding vs transformers fp32 {rel(f32, hf32[i]):.2e}; "
                  f"transformers bf16 vs fp32 {rel(hf16[i], hf32[i]):.4f}")
            for name, k in kiln.items():
                print(f"  kiln {name}: vs transformers bf16 {rel(k, hf16[i]):.4f}, vs fp32 {rel(k, hf32[i]):.4f}")
            print(f"  {'variant':34} {'vs HF bf16':>10} {'vs fp32':>8}" + "".join(f" {'vs kiln ' + n:>16}" for n in kiln))
            for name, on in variants():
                y = forward(model, ids, on)
                line = f"  {name:34} {rel(y, hf16[i]):10.4f} {rel(y, hf32[i]):8.4f}"
                line += "".join(f" {rel(y, k):16.4f}" for k in kiln.values())
                print(line, flush=True)


if __name__ == "__main__":
    main()
