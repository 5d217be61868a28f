package main

import (
	"fmt"
	"io/fs"
	"os"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/chat"
	"github.com/kiln-llm/kiln/demo"
	"github.com/kiln-llm/kiln/gguf"
	"github.com/kiln-llm/kiln/model"
	"github.com/kiln-llm/kiln/tokenizer"
)

// modelPath is the model a command names with --model: a Hugging Face
// directory, a GGUF file, or "" for the embedded demo model. Every command
// loads the parts it needs (config, weights, tokenizer, chat template)
// through its methods, which know the three forms.
type modelPath string

// resolveModel is the model a --model reference names (a path, a name of
// the Hugging Face cache or of Ollama's store: resolveModelPath; "" the
// demo model).
func resolveModel(ref string) (modelPath, error) {
	dir, err := resolveModelPath(ref)
	return modelPath(dir), err
}

// String names the model in errors.
func (p modelPath) String() string {
	if p == "" {
		return "the demo model"
	}
	return string(p)
}

// demoFS is the demo model's files, or nil for a path.
func (p modelPath) demoFS() fs.FS {
	if p == "" {
		return demo.FS()
	}
	return nil
}

// config reads the model's config (without its weights): a bad path fails
// here, before a GPU starts.
func (p modelPath) config() (*model.Config, error) {
	if fsys := p.demoFS(); fsys != nil {
		return model.ReadConfig(fsys, demoName)
	}
	return model.ReadPathConfig(string(p))
}

// weights loads the model on b.
func (p modelPath) weights(b backend.Backend, opts model.Options) (*model.Model, error) {
	var m *model.Model
	var err error
	if fsys := p.demoFS(); fsys != nil {
		m, err = model.LoadFS(fsys, b, opts)
	} else {
		m, err = model.Load(string(p), b, opts)
	}
	if err != nil {
		return nil, fmt.Errorf("loading %s: %w", p, err)
	}
	return m, nil
}

// gguf opens the GGUF file the path names, or returns nil for a directory
// or the demo model.
func (p modelPath) gguf() (*gguf.File, error) {
	if p == "" {
		return nil, nil
	}
	file, isGGUF, err := model.GGUFFile(string(p))
	if err != nil || !isGGUF {
		return nil, err
	}
	return gguf.Open(file)
}

// tokenizer reads the tokenizer.json of a directory or the tokenizer.ggml
// metadata of a GGUF file.
func (p modelPath) tokenizer() (*tokenizer.Tokenizer, error) {
	f, err := p.gguf()
	if err != nil {
		return nil, err
	}
	if f == nil {
		var tok *tokenizer.Tokenizer
		if fsys := p.demoFS(); fsys != nil {
			tok, err = tokenizer.LoadFS(fsys)
		} else {
			tok, err = tokenizer.Load(string(p))
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err) // the error names the tokenizer
		}
		return tok, nil
	}
	defer f.Close()
	return ggufTokenizer(f)
}

// ggufTokenizer builds the tokenizer of a GGUF file's tokenizer.ggml.*
// metadata.
func ggufTokenizer(f *gguf.File) (*tokenizer.Tokenizer, error) {
	v := tokenizer.GGUFVocab{SpecialIDs: map[string]int64{}}
	v.Model, _ = f.String("tokenizer.ggml.model")
	v.Pre, _ = f.String("tokenizer.ggml.pre")
	v.Tokens, _ = f.Strings("tokenizer.ggml.tokens")
	v.Merges, _ = f.Strings("tokenizer.ggml.merges")
	if types, ok := f.Ints("tokenizer.ggml.token_type"); ok {
		for _, t := range types {
			v.Types = append(v.Types, int32(max(min(t, 1<<30), -1)))
		}
	}
	for _, k := range []string{"bos", "eos", "padding", "unknown", "seperator", "mask"} {
		if id, ok := f.Int("tokenizer.ggml." + k + "_token_id"); ok {
			v.SpecialIDs[k] = id
		}
	}
	tok, err := tokenizer.FromGGUF(v)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f.Name, err)
	}
	return tok, nil
}

// template reads the chat template files of a directory (see
// chat.LoadTemplate) or the tokenizer.chat_template of a GGUF file.
func (p modelPath) template() (*chat.Template, error) {
	f, err := p.gguf()
	if err != nil {
		return nil, err
	}
	if f == nil {
		fsys := p.demoFS()
		if fsys == nil {
			fsys = os.DirFS(string(p))
		}
		tmpl, err := chat.LoadTemplate(fsys)
		if err != nil {
			return nil, fmt.Errorf("%s: chat template: %w", p, err)
		}
		return tmpl, nil
	}
	defer f.Close()
	return ggufTemplate(f)
}

// ggufTemplate parses a GGUF file's tokenizer.chat_template.
func ggufTemplate(f *gguf.File) (*chat.Template, error) {
	src, ok := f.String("tokenizer.chat_template")
	if !ok {
		return nil, fmt.Errorf("%s has no tokenizer.chat_template", f.Name)
	}
	tmpl, err := chat.ParseTemplate(src)
	if err != nil {
		return nil, fmt.Errorf("%s: chat template: %w", f.Name, err)
	}
	return tmpl, nil
}
