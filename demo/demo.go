// Package demo embeds kiln's demo model: a 6-million-parameter Qwen3 with its
// own 6144-token byte-level BPE tokenizer, trained on the Go standard
// library's sources (BSD licence, in model/LICENSE) by scripts/train_demo.py.
// It lets kiln run and serve with no model argument, offline, and completes
// Go code plausibly; it is far too small for anything else. README.md says
// how it was trained and what it answers.
package demo

import (
	"embed"
	"io/fs"
)

// Name is the model name the demo model is served under.
const Name = "kiln-demo"

//go:embed model
var files embed.FS

// FS returns the demo model as a model directory: config.json,
// model.safetensors (bf16), tokenizer.json, tokenizer_config.json,
// chat_template.jinja, generation_config.json and the training data's
// LICENSE, all at its root.
func FS() fs.FS {
	sub, err := fs.Sub(files, "model")
	if err != nil {
		panic("demo: " + err.Error()) // "model" is a valid path: unreachable
	}
	return sub
}
