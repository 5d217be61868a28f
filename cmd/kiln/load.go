package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/kiln-llm/kiln/catalog"
	"github.com/kiln-llm/kiln/chat"
	"github.com/kiln-llm/kiln/demo"
	"github.com/kiln-llm/kiln/engine"
	"github.com/kiln-llm/kiln/gguf"
	"github.com/kiln-llm/kiln/model"
	"github.com/kiln-llm/kiln/tokenizer"
)

// modelFlags are the flags of every command that loads a model.
type modelFlags struct {
	dir        string
	backend    string
	maxRunning int
	maxTokens  int
	kvMiB      int64
	kv         string
	quantize   string
	// conversations: the command serves multi-turn chats, so the engine
	// prepares each chat's next turn (engine.Options.PrepareNextTurn); not
	// for a one-shot kiln run, which would wait for it before exiting.
	conversations bool
	// pull downloads a hub --model that is not cached (kiln run and chat's
	// --pull; offerPull: the command has that flag). resolve fills name
	// (the model's name in the API; "" for a path) and resolved.
	pull, offerPull bool
	name            string
	resolved        *catalog.Model
}

func (f *modelFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.dir, "model", "", "model: a name of the Hugging Face cache (Qwen/Qwen3-8B, ORG/NAME-GGUF:Q4_K_M; see kiln ls, kiln pull) or of Ollama's store (qwen3:8b), a Hugging Face directory (config.json, *.safetensors, tokenizer.json; bf16 or Qwen's FP8) or a GGUF file; default: the embedded demo model")
	fs.StringVar(&f.backend, "backend", "auto", "compute backend: auto, cpu or cuda")
	fs.IntVar(&f.maxRunning, "max-running", 0, "most sequences decoded together (default: the engine's, 16)")
	fs.IntVar(&f.maxTokens, "max-batch-tokens", 0, "most tokens in one forward step, prompt chunks and decoding sequences together (default: 256 on the CPU, 2048 on a GPU)")
	fs.Int64Var(&f.kvMiB, "kv-memory", 0, "MiB of KV cache (default: 1024 on the CPU; on a GPU, what the weights leave free)")
	fs.StringVar(&f.kv, "kv", "", kvFlagHelp)
	fs.StringVar(&f.quantize, "quantize", "", quantizeFlagHelp)
}

// loaded is a model ready to serve.
type loaded struct {
	name    string
	dir     string // absolute; "" for the embedded demo model
	backend string
	ctxLen  int
	// defaults are the model's generation_config sampling parameters.
	defaults engine.Sampling
	tok      *tokenizer.Tokenizer
	eng      *engine.Engine
}

// demoName is the embedded demo model's name in the API.
const demoName = "kiln-demo"

// tokenText returns the text of one token (for logprobs).
func (l *loaded) tokenText(id int32) string { return l.tok.Decode([]int32{id}) }

// regularVocab is the number of ids below the first special token: random
// prompts drawn from them contain no control tokens.
func (l *loaded) regularVocab() int {
	n := l.tok.VocabSize()
	for id := range n {
		if l.tok.IsSpecial(int32(id)) {
			return id
		}
	}
	return n
}

// load opens the model directory (or the demo model), its tokenizer and
// chat template, and starts an engine on the chosen backend. A progress bar
// shows on stderr while weights load, when stderr is a terminal.
func (f *modelFlags) load() (*loaded, error) {
	// The engine refuses these too, but by printing its whole Options.
	for _, v := range []struct {
		flag string
		n    int64
	}{{"--max-running", int64(f.maxRunning)}, {"--max-batch-tokens", int64(f.maxTokens)}, {"--kv-memory", f.kvMiB}} {
		if v.n < 0 {
			return nil, fmt.Errorf("%s must be positive, not %d (0: the engine's default)", v.flag, v.n)
		}
	}
	if f.maxTokens > 0 && f.maxRunning > f.maxTokens {
		return nil, fmt.Errorf("--max-running %d exceeds --max-batch-tokens %d: every running sequence needs a token per step", f.maxRunning, f.maxTokens)
	}
	opts := engine.Options{MaxRunning: f.maxRunning, MaxBatchTokens: f.maxTokens, KVMemory: f.kvMiB << 20, PrepareNextTurn: f.conversations}
	if opts.MaxBatchTokens == 0 && f.maxRunning > 256 {
		opts.MaxBatchTokens = f.maxRunning // every running sequence needs a token per step
	}
	if err := f.resolve(); err != nil {
		return nil, err
	}
	// The config first: a bad model directory fails before a GPU starts.
	if _, err := modelConfig(f.dir, ""); err != nil {
		return nil, err
	}
	b, err := openBackend(f.backend)
	if err != nil {
		return nil, err
	}
	kv, err := kvDType(f.kv, b)
	if err != nil {
		return nil, err
	}
	q, err := quantizeType(f.quantize)
	if err != nil {
		return nil, err
	}
	bar := newProgressBar(os.Stderr, "loading")
	mopts := model.Options{Progress: bar.update, KVDType: kv, Quantize: q}
	start := time.Now()
	var (
		m    *model.Model
		tok  *tokenizer.Tokenizer
		tmpl *chat.Template
		dir  string
	)
	if f.dir == "" {
		fsys := demo.FS()
		if m, err = model.LoadFS(fsys, b, mopts); err != nil {
			return nil, fmt.Errorf("loading the demo model: %w", err)
		}
		if tok, err = tokenizer.LoadFS(fsys); err != nil {
			return nil, fmt.Errorf("loading the demo model's tokenizer: %w", err)
		}
		if tmpl, err = chat.LoadTemplate(fsys); err != nil {
			return nil, fmt.Errorf("loading the demo model's chat template: %w", err)
		}
	} else {
		if dir, err = filepath.Abs(f.dir); err != nil {
			return nil, err
		}
		if m, err = model.Load(dir, b, mopts); err != nil {
			return nil, fmt.Errorf("loading %s: %w", f.dir, err)
		}
		if tok, tmpl, err = loadText(dir); err != nil {
			m.Close()
			return nil, fmt.Errorf("loading %s: %w", f.dir, err)
		}
	}
	bar.finish()
	if gpu, ok := b.(interface{ FreeMemory() int64 }); ok {
		// On a GPU the KV pool takes the memory the weights left, less
		// room for the step's workspace, and prompts prefill in larger
		// chunks: the tensor cores need them to be busy.
		if f.kvMiB == 0 {
			opts.KVMemory = max(gpu.FreeMemory()*9/10-2<<30, 256<<20)
		}
		if opts.MaxBatchTokens == 0 {
			opts.MaxBatchTokens = 2048
		}
	}
	eng, err := engine.New(m, tok, tmpl, opts)
	if err != nil {
		return nil, fmt.Errorf("starting the engine: %w", err)
	}
	cfg := m.Config()
	name := cfg.Name
	if dir == "" {
		name = demoName
	}
	if f.name != "" {
		name = f.name
	}
	d := cfg.Defaults
	defaults := engine.Sampling{Temperature: d.Temperature, TopP: d.TopP, TopK: d.TopK, MinP: d.MinP, RepetitionPenalty: d.RepetitionPenalty}
	eo := eng.Options()
	slog.Info("model loaded", "model", name, "backend", b.Name(), "weights", humanBytes(m.WeightBytes()), "kv", kv,
		"kv_memory", humanBytes(int64(eo.KVBlocks*eo.BlockSize)*m.KVBytesPerToken()), "kv_tokens", eo.KVBlocks*eo.BlockSize,
		"state_per_sequence", humanBytes(int64(m.SlotBytes())),
		"context", cfg.ContextLength, "took", time.Since(start).Round(time.Millisecond))
	return &loaded{name: name, dir: dir, backend: b.Name(), ctxLen: cfg.ContextLength, defaults: defaults, tok: tok, eng: eng}, nil
}

// loadText returns the tokenizer and chat template of the model at path.
func loadText(path string) (*tokenizer.Tokenizer, *chat.Template, error) {
	tok, err := loadTokenizer(path)
	if err != nil {
		return nil, nil, err
	}
	tmpl, err := loadTemplate(path)
	if err != nil {
		return nil, nil, err
	}
	return tok, tmpl, nil
}

// openGGUF opens the GGUF file path names, or returns nil for a Hugging
// Face directory.
func openGGUF(path string) (*gguf.File, error) {
	file, isGGUF, err := model.GGUFFile(path)
	if err != nil || !isGGUF {
		return nil, err
	}
	return gguf.Open(file)
}

// loadTokenizer reads a directory's tokenizer.json or a GGUF file's
// tokenizer.ggml metadata.
func loadTokenizer(path string) (*tokenizer.Tokenizer, error) {
	f, err := openGGUF(path)
	if err != nil {
		return nil, err
	}
	if f == nil {
		tok, err := tokenizer.Load(path)
		if err != nil {
			return nil, fmt.Errorf("tokenizer: %w", err)
		}
		return tok, nil
	}
	defer f.Close()
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

// loadTemplate reads a directory's chat template files or a GGUF file's
// tokenizer.chat_template.
func loadTemplate(path string) (*chat.Template, error) {
	f, err := openGGUF(path)
	if err != nil {
		return nil, err
	}
	if f == nil {
		tmpl, err := chat.LoadTemplate(os.DirFS(path))
		if err != nil {
			return nil, fmt.Errorf("chat template: %w", err)
		}
		return tmpl, nil
	}
	defer f.Close()
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

// isTerminal reports whether f is a character device (a terminal, not a
// pipe or file).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// progressBar draws "label [=====>    ] 45% 1.2/2.6 GB" on one terminal
// line, at most every 100 ms; it draws nothing when w is not a terminal.
type progressBar struct {
	mu    sync.Mutex
	w     io.Writer
	label string
	on    bool
	last  time.Time
	drawn bool
}

func newProgressBar(f *os.File, label string) *progressBar {
	return &progressBar{w: f, label: label, on: isTerminal(f)}
}

func (p *progressBar) update(done, total int64) {
	if !p.on || total <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if time.Since(p.last) < 100*time.Millisecond && done < total {
		return
	}
	p.last = time.Now()
	const width = 30
	frac := float64(done) / float64(total)
	if frac > 1 {
		frac = 1
	}
	n := int(frac * width)
	bar := strings.Repeat("=", n)
	if n < width {
		bar += ">" + strings.Repeat(" ", width-n-1)
	}
	fmt.Fprintf(p.w, "\r%s [%s] %3.0f%% %s/%s", p.label, bar, frac*100, humanBytes(done), humanBytes(total))
	p.drawn = true
}

func (p *progressBar) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
	}
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MB", float64(n)/(1<<20))
	case n < 1<<10:
		return fmt.Sprintf("%d B", n)
	}
	return fmt.Sprintf("%d kB", n>>10)
}
