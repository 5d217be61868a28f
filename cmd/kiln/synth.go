package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/gguf"
	"github.com/kiln-llm/kiln/model"
)

// kiln synth: a synthetic model written as a GGUF file, so that kiln and
// llama.cpp can be measured on the same weights at published shapes.
func init() {
	register(&command{
		name:    "synth",
		summary: "write a synthetic model (random weights at a published shape) as a GGUF file, for llama.cpp",
		run:     synthCmd,
	})
}

const synthUsage = `usage: kiln synth --synthetic NAME [--layers N] [--dtype bf16|f16|f32] [--seed S] [--vocab-from FILE.gguf] --out FILE.gguf

Writes the synthetic model NAME (random weights at a published shape, as
'kiln bench --synthetic NAME' builds it) as a GGUF v3 file in llama.cpp's
layout: the tensor names, shapes, types, stored transforms and metadata
keys llama.cpp's convert_hf_to_gguf.py writes for the model's checkpoint.
It writes the qwen3, qwen3moe and qwen3next architectures only: the
Qwen3.5 shapes (qwen35, qwen35moe) that 'kiln bench --synthetic' also
builds have no GGUF writer. With the same --layers, --dtype and --seed
(bench uses seed 1, the default here), 'kiln bench --model FILE.gguf' runs
the same weights as 'kiln bench --synthetic NAME'; llama.cpp runs the file
as is (llama-bench, llama-cli) and llama-quantize makes Q8_0, Q4_K_M, ...
from it. The file is written tensor by tensor: an 8B model in bf16 takes
16 GB of disk, not of memory.

The vocabulary: the synthetic shapes have Qwen's 151936 ids but no
tokenizer. Without --vocab-from the file holds a minimal byte-level BPE
vocabulary of that size (the 256 byte tokens, a few merges, Qwen's
<|endoftext|>, <|im_start|> and <|im_end|>, unused [PAD<id>] tokens for the
rest), so the embeddings and the LM head keep their published size. With
--vocab-from FILE.gguf every tokenizer.* key of that file (a small one,
e.g. testdata/quant/qwen3-w256-Q8_0.gguf, 512 tokens) is copied and
vocab_size becomes its token count: the embeddings and the LM head are
then vocab x hidden (the first rows of the synthetic model's), not
151936 x hidden, which changes what a decode step reads.

Names: %s.
Not written (bench --synthetic only): %s.

flags:
`

// unwritableSynthetic lists the synthetic models bench builds that synth
// cannot write (model.SyntheticGGUFNames).
func unwritableSynthetic() []string {
	ok := model.SyntheticGGUFNames()
	var out []string
	for _, n := range model.SyntheticNames() {
		if !slices.Contains(ok, n) {
			out = append(out, n)
		}
	}
	return out
}

func synthCmd(args []string) error {
	fs := flag.NewFlagSet("synth", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), synthUsage, strings.Join(model.SyntheticGGUFNames(), ", "), strings.Join(unwritableSynthetic(), ", "))
		fs.PrintDefaults()
	}
	name := fs.String("synthetic", "", "the synthetic model (e.g. qwen3-8b)")
	layers := fs.Int("layers", 0, "keep only the first N layers (0: all)")
	dtype := fs.String("dtype", "bf16", "weight dtype, as the converter's --outtype: bf16, f16 or f32 (norms, routers and the DeltaNet's conv and 1-D tensors are f32 in any case, as the converter keeps them)")
	seed := fs.Uint64("seed", 1, "the weights' seed (kiln bench --synthetic uses 1)")
	vocabFrom := fs.String("vocab-from", "", "copy the tokenizer.* metadata of this GGUF file; vocab_size becomes its token count")
	out := fs.String("out", "", "the GGUF file to write")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	case *name == "":
		return fmt.Errorf("--synthetic is required (one of %s)", strings.Join(model.SyntheticGGUFNames(), ", "))
	case *out == "":
		return fmt.Errorf("--out is required")
	case *layers < 0:
		return fmt.Errorf("--layers must not be negative")
	}
	var dt backend.DType
	switch *dtype {
	case "bf16":
		dt = backend.BF16
	case "f16":
		dt = backend.F16
	case "f32":
		dt = backend.F32
	default:
		return fmt.Errorf("--dtype %q: want bf16, f16 or f32 (llama-quantize makes the quantized types from the file)", *dtype)
	}
	opts := model.SyntheticGGUFOptions{Layers: *layers, Seed: *seed, DType: dt,
		Warn: func(s string) { fmt.Fprintf(os.Stderr, "kiln synth: warning: %s\n", s) }}
	if *vocabFrom != "" {
		v, err := tokenizerMeta(*vocabFrom)
		if err != nil {
			return err
		}
		opts.Vocab = v
	}

	// Written beside the destination and renamed into place when complete,
	// so that a failed run leaves no partial file.
	tmp, err := os.CreateTemp(filepath.Dir(*out), "."+filepath.Base(*out)+".*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after the rename, a no-op
	bar := newProgressBar(os.Stderr, "writing")
	opts.Progress = bar.update
	start := time.Now()
	err = model.WriteSyntheticGGUF(tmp, *name, opts)
	bar.finish()
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), *out); err != nil {
		return err
	}
	f, err := gguf.Open(*out)
	if err != nil {
		return fmt.Errorf("reading back %s: %w", *out, err)
	}
	defer f.Close()
	st, _ := os.Stat(*out)
	toks, _ := f.Strings("tokenizer.ggml.tokens")
	fmt.Fprintf(os.Stderr, "wrote %s: %s, %d tensors, vocabulary of %d tokens, %s in %.1fs\n",
		*out, f.Architecture(), len(f.Tensors), len(toks), humanBytes(st.Size()), time.Since(start).Seconds())
	return nil
}

// tokenizerMeta returns the tokenizer.* metadata of a GGUF file.
func tokenizerMeta(path string) ([]gguf.KV, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close() // the metadata is copied out of the mapping
	var kvs []gguf.KV
	for _, kv := range f.KV {
		if strings.HasPrefix(kv.Key, "tokenizer.") {
			kvs = append(kvs, kv)
		}
	}
	if _, ok := f.Strings("tokenizer.ggml.tokens"); !ok {
		return nil, fmt.Errorf("--vocab-from %s: the file has no tokenizer.ggml.tokens", path)
	}
	return kvs, nil
}
