package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/catalog"
	"github.com/kiln-llm/kiln/chat"
	"github.com/kiln-llm/kiln/engine"
	"github.com/kiln-llm/kiln/gguf"
	"github.com/kiln-llm/kiln/model"
	"github.com/kiln-llm/kiln/session"
	"github.com/kiln-llm/kiln/tokenizer"
)

// modelFlags are the flags of every command that loads a model.
type modelFlags struct {
	dir        string
	backend    string
	maxRunning int
	maxTokens  int
	kvMiB      int64
	context    int
	kv         string
	quantize   string
	gpus       string
	// synthetic: random weights at a published shape instead of --model
	// (bench serve's --synthetic, --layers, --dtype), served with a
	// synthetic vocabulary (model.SyntheticVocab).
	synthetic string
	layers    int
	dtype     string
	// conversations: the command serves multi-turn chats, so the session
	// prepares each chat's next turn (session.Options.PrepareNextTurn); not
	// for a one-shot kiln run, which would wait for it before exiting.
	conversations bool
	// stateCache: serve's state cache (none unless set).
	stateCache engine.StateCache
	// pull downloads a hub --model that is not cached (kiln run and chat's
	// --pull; offerPull: the command has that flag). resolve fills name
	// (the model's name in the API; "" for a path) and resolved.
	pull, offerPull bool
	name            string
	resolved        *catalog.Model
}

// modelFlagHelp is the help of a command's --model: the forms
// resolveModel and model.GGUFFile take. files are what the command reads of
// a Hugging Face directory; tail ends the text (the default, or the
// alternative).
func modelFlagHelp(files, tail string) string {
	return "model: a Hugging Face directory (" + files + "), a GGUF file or a directory holding one, " +
		"or a name of the Hugging Face cache (Qwen/Qwen3-8B, ORG/NAME-GGUF:Q4_K_M; see kiln ls, kiln pull) or of Ollama's store (qwen3:8b)" + tail
}

// weightFiles are what a command that loads the weights reads of a Hugging
// Face directory, for modelFlagHelp.
const weightFiles = "config.json, *.safetensors of bf16, f16, f32 or Qwen's FP8 weights"

func (f *modelFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.dir, "model", "", modelFlagHelp("tokenizer.json, "+weightFiles, "; default: the embedded demo model"))
	fs.StringVar(&f.backend, "backend", "auto", "compute backend: auto, cpu or cuda")
	fs.IntVar(&f.maxRunning, "max-running", 0, "most sequences decoded together (default: the engine's, 16)")
	fs.IntVar(&f.maxTokens, "max-batch-tokens", 0, "most tokens in one forward step, prompt chunks and decoding sequences together (default: 256 on the CPU, 2048 on a GPU)")
	fs.Int64Var(&f.kvMiB, "kv-memory", 0, "MiB of KV cache (default: on the CPU, half the memory available once the weights are loaded; on a GPU, what the weights leave free)")
	fs.IntVar(&f.context, "context", 0, "most tokens of one request, prompt and answer (default: the model's context length, or what the KV cache holds for one sequence when that is less)")
	fs.StringVar(&f.kv, "kv", "", kvFlagHelp)
	fs.StringVar(&f.quantize, "quantize", "", quantizeFlagHelp)
	fs.StringVar(&f.gpus, "gpus", "", gpusFlagHelp)
}

// loadInfo is how f loads its model, as a server's status says it (beside
// its backend), so that kiln run can tell whether a daemon serves the
// model the way its own flags ask (differs).
func (f *modelFlags) loadInfo() map[string]string {
	info := map[string]string{"gpus": f.gpus}
	if kv, err := kvDType(f.kv); err == nil {
		info["kv"] = kv.String()
	}
	if q, err := quantizeType(f.quantize); err == nil && q != backend.F32 {
		info["quantize"] = q.String()
	}
	return info
}

// differs names the first of f's load flags that was given and that info
// (a daemon's status, loadInfo and its backend) does not match; "" when
// none.
func (f *modelFlags) differs(info map[string]string) string {
	mine := f.loadInfo()
	switch {
	case f.quantize != "" && mine["quantize"] != info["quantize"]:
		return "--quantize " + f.quantize
	case f.kv != "" && mine["kv"] != info["kv"]:
		return "--kv " + f.kv
	case f.gpus != "" && f.gpus != info["gpus"]:
		return "--gpus " + f.gpus
	case f.backend != "" && f.backend != "auto" && !strings.HasSuffix(info["backend"], f.backend):
		return "--backend " + f.backend
	}
	return ""
}

// registerSynthetic adds the flags of a synthetic model (benchmarks).
func (f *modelFlags) registerSynthetic(fs *flag.FlagSet) {
	fs.StringVar(&f.synthetic, "synthetic", "", "serve a synthetic model (random weights at a published shape, a synthetic vocabulary of its size) instead of --model: "+strings.Join(model.SyntheticNames(), ", "))
	fs.IntVar(&f.layers, "layers", 0, "with --synthetic: keep only the first N layers (0: all)")
	fs.StringVar(&f.dtype, "dtype", "bf16", "with --synthetic: "+dtypeFlagHelp)
}

// loaded is a model ready to serve.
type loaded struct {
	name    string
	dir     string // absolute; "" for the embedded demo model
	backend string
	// defaults are the model's generation_config sampling parameters.
	defaults engine.Sampling
	tok      *tokenizer.Tokenizer
	sess     *session.Session
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

// load opens the model (a directory, a GGUF file or the demo model), its
// tokenizer and chat template, and starts an engine and its session on the
// chosen backend. A progress bar shows on stderr while weights load, when
// stderr is a terminal.
func (f *modelFlags) load() (*loaded, error) {
	// The engine refuses these too, but by printing its whole Options.
	for _, v := range []struct {
		flag string
		n    int64
	}{{"--max-running", int64(f.maxRunning)}, {"--max-batch-tokens", int64(f.maxTokens)}, {"--kv-memory", f.kvMiB}, {"--context", int64(f.context)}} {
		if v.n < 0 {
			return nil, fmt.Errorf("%s must be positive, not %d (0: the engine's default)", v.flag, v.n)
		}
	}
	if f.maxTokens > 0 && f.maxRunning > f.maxTokens {
		return nil, fmt.Errorf("--max-running %d exceeds --max-batch-tokens %d: every running sequence needs a token per step", f.maxRunning, f.maxTokens)
	}
	opts := engine.Options{MaxRunning: f.maxRunning, MaxBatchTokens: f.maxTokens, KVMemory: f.kvMiB << 20, Context: f.context}
	if opts.MaxBatchTokens == 0 && f.maxRunning > 256 {
		opts.MaxBatchTokens = f.maxRunning // every running sequence needs a token per step
	}
	if f.synthetic != "" && f.dir != "" {
		return nil, errors.New("give one of --model and --synthetic")
	}
	if f.layers != 0 && f.synthetic == "" {
		return nil, errors.New("--layers keeps the first layers of a --synthetic model; give --synthetic NAME")
	}
	if err := f.resolve(); err != nil {
		return nil, err
	}
	var dir string // absolute, for /status and the daemon's clients
	if f.dir != "" {
		var err error
		if dir, err = filepath.Abs(f.dir); err != nil {
			return nil, err
		}
	}
	wdt := backend.BF16
	if f.synthetic != "" {
		var err error
		if wdt, err = parseDType(f.dtype); err != nil {
			return nil, fmt.Errorf("--dtype: %w", err)
		}
	}
	bar := newProgressBar(os.Stderr, "loading")
	start := time.Now()
	m, b, err := openModel(f.backend, modelSource{dir: f.dir, synthetic: f.synthetic, layers: f.layers, dtype: wdt,
		kv: f.kv, quantize: f.quantize, gpus: f.gpus, progress: bar.update})
	bar.finish()
	if err != nil {
		return nil, err
	}
	path := modelPath(f.dir)
	cfg := m.Config()
	var tok *tokenizer.Tokenizer
	var tmpl *chat.Template
	if f.synthetic != "" {
		tok, tmpl, err = syntheticVocab(cfg)
	} else if tok, err = path.tokenizer(); err == nil {
		tmpl, err = path.template()
	}
	if err != nil && (tok == nil || cfg.Embedding == nil) { // an embedding model needs no template
		m.Close()
		return nil, err
	}
	d := cfg.Defaults
	defaults := engine.Sampling{Temperature: d.Temperature, TopP: d.TopP, TopK: d.TopK, MinP: d.MinP, RepetitionPenalty: d.RepetitionPenalty}
	if err := defaults.Validate(); err != nil {
		m.Close()
		return nil, fmt.Errorf("%s: generation_config: %w", path, err)
	}
	if f.context > cfg.ContextLength {
		m.Close()
		return nil, fmt.Errorf("--context %d exceeds the model's context length of %d tokens", f.context, cfg.ContextLength)
	}
	gpu, onGPU := b.(interface{ FreeMemory() int64 })
	switch {
	case onGPU && f.kvMiB == 0:
		// On a GPU the KV cache and the state slots take the memory the
		// weights left, less room for the step's workspace.
		opts.KVMemory = max(gpu.FreeMemory()*9/10-2<<30, 256<<20)
	case f.kvMiB == 0:
		// On the CPU, half of what the weights left (the rest for the
		// system and the step's workspace), and at least what --context
		// needs.
		if avail := availableMemory(); avail > 0 {
			opts.KVMemory = max(avail/2, 256<<20)
		}
		if f.context > 0 {
			need, err := engine.MemoryFor(m, opts)
			if err != nil {
				m.Close()
				return nil, err
			}
			opts.KVMemory = max(opts.KVMemory, need)
		}
	}
	if onGPU && opts.MaxBatchTokens == 0 {
		// Prompts prefill in larger chunks on a GPU: the tensor cores
		// need them to be busy.
		opts.MaxBatchTokens = 2048
	}
	if onGPU {
		// A full chunk: the first request's prefill then finds the kernels
		// loaded and the step's buffers at their size.
		opts.WarmUp = opts.MaxBatchTokens
	}
	if sc := f.stateCache; sc.Dir != "" || sc.RAMBytes > 0 {
		digest, err := weightsDigest(path, f.resolved)
		if err != nil {
			m.Close()
			return nil, fmt.Errorf("the state cache's key of %s: %w", path, err)
		}
		kv, _ := kvDType(f.kv)
		sc.Model = fmt.Sprintf("weights %s|backend %s|quantize %q|kv %v", digest, b.Name(), f.quantize, kv)
		if m.Ranks() > 1 {
			// A split model's saved states hold each rank's part in
			// turn: a cache written across two GPUs is not read on one.
			sc.Model += fmt.Sprintf("|ranks %d", m.Ranks())
		}
		opts.StateCache = sc
	}
	eng, err := engine.New(m, tok, opts)
	if err != nil {
		m.Close()
		if f.context > 0 {
			return nil, fmt.Errorf("starting the engine: %w (--kv-memory sets the KV cache's MiB, --context the context)", err)
		}
		return nil, fmt.Errorf("starting the engine: %w", err)
	}
	name := cfg.Name
	if dir == "" && f.synthetic == "" {
		name = demoName
	}
	if f.name != "" {
		name = f.name
	}
	eo := eng.Options()
	ctx, ctxLimit := eng.Context()
	kv, _ := kvDType(f.kv) // as openModel resolved it
	attrs := []any{"model", name, "backend", b.Name(), "gpus", m.Ranks(), "weights", humanBytes(m.WeightBytes()), "kv", kv,
		"kv_memory", humanBytes(int64(eo.KVBlocks*eo.BlockSize) * m.KVBytesPerToken()), "kv_tokens", eo.KVBlocks * eo.BlockSize}
	if m.Hybrid() {
		attrs = append(attrs, "state_per_sequence", humanBytes(int64(m.SlotBytes())), "state_memory", humanBytes(eng.StateBytes()))
	}
	slog.Info("model loaded", append(attrs, "context", ctx, "context_limited_by", ctxLimit, "model_context", cfg.ContextLength,
		"took", time.Since(start).Round(time.Millisecond))...)
	if sc := opts.StateCache; sc.Dir != "" {
		slog.Info("state cache", "dir", sc.Dir, "size", humanBytes(sc.DiskBytes), "ram", humanBytes(sc.RAMBytes))
	}
	sess := session.New(eng, tok, tmpl, session.Options{PrepareNextTurn: f.conversations})
	on := b.Name()
	if m.Ranks() > 1 {
		on = fmt.Sprintf("%d x %s", m.Ranks(), on) // what /status and the daemon's clients show
	}
	return &loaded{name: name, dir: dir, backend: on, defaults: defaults, tok: tok, sess: sess}, nil
}

// syntheticVocab is the tokenizer and chat template of a synthetic model
// of config cfg: model.SyntheticVocab's, of the model's vocabulary size,
// whose unused ids ([PAD<id>], most of them) are made normal tokens, so
// that the random weights' answers, mostly such ids, have text to stream.
func syntheticVocab(cfg *model.Config) (*tokenizer.Tokenizer, *chat.Template, error) {
	eos := -1
	if len(cfg.EOS) > 0 {
		eos = int(cfg.EOS[0])
	}
	kvs, err := model.SyntheticVocab(cfg.VocabSize, eos)
	if err != nil {
		return nil, nil, err
	}
	f := &gguf.File{Name: "the synthetic vocabulary of " + cfg.Name, Meta: map[string]gguf.Value{}}
	for _, kv := range kvs {
		f.Meta[kv.Key] = kv.Value
	}
	if types, ok := f.Ints("tokenizer.ggml.token_type"); ok {
		const normal, unused = 1, 5 // llama.cpp's token types
		t32 := make([]int32, len(types))
		for i, t := range types {
			t32[i] = int32(t)
			if t == unused {
				t32[i] = normal
			}
		}
		f.Meta["tokenizer.ggml.token_type"] = gguf.Arr(t32)
	}
	tok, err := ggufTokenizer(f)
	if err != nil {
		return nil, nil, err
	}
	tmpl, err := ggufTemplate(f)
	return tok, tmpl, err
}

// availableMemory is the memory the system can give without swapping
// (Linux's MemAvailable), or 0 where it cannot tell.
func availableMemory() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
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
