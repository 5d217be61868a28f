package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kiln-llm/kiln/chat"
	"github.com/kiln-llm/kiln/engine"
	"github.com/kiln-llm/kiln/server"
	"github.com/kiln-llm/kiln/session"
)

func init() {
	register(&command{
		name:    "run",
		summary: "answer one prompt (plus piped stdin) on stdout: kiln run \"prompt\" < file",
		run:     runOnce,
	})
}

// clientFlags are the flags of the commands that talk to a model: run and chat.
type clientFlags struct {
	model       modelFlags
	socket      string
	noDaemon    bool
	think       bool
	system      string
	maxTokens   int
	temperature float64
	seed        int64
	verbose     bool
}

func (c *clientFlags) register(fs *flag.FlagSet) {
	c.model.register(fs)
	c.model.offerPull = true
	fs.BoolVar(&c.model.pull, "pull", false, "download --model from the Hugging Face hub first if it is not in the cache")
	fs.StringVar(&c.socket, "socket", "", "daemon socket to use when a daemon runs there (default: the daemon's default)")
	fs.BoolVar(&c.noDaemon, "no-daemon", false, "load the model in this process even when a daemon runs")
	fs.BoolVar(&c.think, "think", false, "let the model think first (its reasoning goes to stderr when that is a terminal)")
	fs.StringVar(&c.system, "system", "", "system prompt")
	fs.IntVar(&c.maxTokens, "max-tokens", 0, "most tokens to generate (default: until the model stops)")
	fs.Float64Var(&c.temperature, "temperature", -1, "sampling temperature; -1 is the model's default")
	fs.Int64Var(&c.seed, "seed", -1, "random seed; -1 picks one at random")
	fs.BoolVar(&c.verbose, "v", false, "debug logging")
}

// check refuses flags out of range before a model loads: the flags' own
// forms here, the sampling parameters by the engine's bounds, so that a
// request means the same in-process and through the daemon.
func (c *clientFlags) check() error {
	switch {
	case c.maxTokens < 0:
		return fmt.Errorf("--max-tokens must be positive, not %d (0: until the model stops)", c.maxTokens)
	case c.seed < -1:
		return fmt.Errorf("--seed must be at least 0, not %d (-1: random)", c.seed)
	}
	if err := c.params().check(); err != nil {
		var se *engine.SamplingError
		if errors.As(err, &se) {
			return fmt.Errorf("--%s %s", strings.ReplaceAll(se.Param, "_", "-"), se.Reason)
		}
		return err
	}
	return nil
}

// params are the sampling parameters the flags set.
func (c *clientFlags) params() params {
	p := params{}
	if c.temperature != -1 {
		p["temperature"] = c.temperature
	}
	if c.seed >= 0 {
		p["seed"] = float64(c.seed)
	}
	if c.maxTokens > 0 {
		p["max_tokens"] = float64(c.maxTokens)
	}
	return p
}

// parseInterspersed parses flags that may come before or after the
// positional arguments ("kiln run 'prompt' --model x") and returns the
// positional ones.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parseFlags(fs, args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// turn is one request of a conversation.
type turn struct {
	messages []chat.Message
	think    bool
	params   params
}

// answerStats is what one answer cost, measured where it was received.
type answerStats struct {
	promptTokens, cachedTokens, completionTokens int
	ttft, total                                  time.Duration
}

// tokensPerSecond is the decode rate after the first token.
func (s answerStats) tokensPerSecond() float64 {
	d := (s.total - s.ttft).Seconds()
	if s.completionTokens < 2 || d <= 0 {
		return 0
	}
	return float64(s.completionTokens-1) / d
}

// answerer produces chat answers: through a running daemon or a model in
// this process. out receives the answer (and reasoning) as it is generated.
type answerer interface {
	answer(ctx context.Context, t *turn, out func(text, reasoning string)) (answerStats, error)
	close()
}

// connect returns the daemon when one is running (and serves the requested
// model, if --model was given), else loads the model here.
func (c *clientFlags) connect() (answerer, error) {
	if err := c.model.resolve(); err != nil {
		return nil, err
	}
	if !c.noDaemon {
		sock := c.socket
		if sock == "" {
			if dir, err := defaultSocket(); err == nil {
				sock = dir
			}
		}
		if sock != "" {
			if st, err := daemonStatusOf(sock); err == nil {
				want := ""
				if c.model.dir != "" {
					want, _ = filepath.Abs(c.model.dir)
				}
				if want == "" || want == st.Info["model_dir"] {
					// Loading a second copy beside the daemon's would double
					// the model's memory: the user decides.
					if d := c.model.differs(st.Info); d != "" {
						return nil, fmt.Errorf("the daemon on %s serves %s loaded otherwise than %s asks: restart it with that (kiln stop, kiln start %s), or load the model here with --no-daemon", sock, st.Model, d, d)
					}
					slog.Debug("using the daemon", "socket", sock, "model", st.Model)
					return &daemonAnswerer{c: c, http: socketClient(sock)}, nil
				}
				slog.Debug("the daemon serves another model; loading here", "daemon", st.Info["model_dir"], "want", want)
			}
		}
	}
	lm, err := c.model.load()
	if err != nil {
		return nil, err
	}
	return &localAnswerer{c: c, lm: lm}, nil
}

// defaultSocket is the default daemon socket path, without creating its
// directory.
func defaultSocket() (string, error) {
	dir, err := server.DefaultSocketDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "kiln.sock"), nil
}

// localAnswerer runs the model in this process, through a session.
type localAnswerer struct {
	c  *clientFlags
	lm *loaded
}

func (a *localAnswerer) close() { a.lm.sess.Close() }

func (a *localAnswerer) answer(ctx context.Context, t *turn, out func(text, reasoning string)) (answerStats, error) {
	st, err := a.lm.sess.Generate(ctx, &session.Request{Messages: t.messages,
		TemplateKwargs: map[string]any{"enable_thinking": t.think}, Sampling: t.params.sampling(a.lm.defaults)})
	if err != nil {
		return answerStats{}, err
	}
	for {
		ev := st.Next()
		if ev.Text != "" || ev.Reasoning != "" {
			out(ev.Text, ev.Reasoning)
		}
		if !ev.Done {
			continue
		}
		switch ev.Finish {
		case engine.FinishError:
			return answerStats{}, ev.Err
		case engine.FinishCancelled:
			return answerStats{}, context.Canceled
		}
		var s answerStats
		if u := ev.Usage; u != nil {
			s = answerStats{promptTokens: u.PromptTokens, cachedTokens: u.CachedTokens, completionTokens: u.CompletionTokens, ttft: u.TTFT, total: u.Duration}
		}
		return s, nil
	}
}

// daemonAnswerer sends the conversation to the daemon's chat completions
// endpoint and reads the streamed answer.
type daemonAnswerer struct {
	c    *clientFlags
	http *http.Client
}

func (a *daemonAnswerer) close() {}

func (a *daemonAnswerer) answer(ctx context.Context, t *turn, out func(text, reasoning string)) (answerStats, error) {
	body := map[string]any{
		"messages":             t.messages,
		"stream":               true,
		"stream_options":       map[string]bool{"include_usage": true},
		"chat_template_kwargs": map[string]bool{"enable_thinking": t.think},
	}
	t.params.request(body)
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, "POST", "http://kiln/v1/chat/completions", bytes.NewReader(b))
	if err != nil {
		return answerStats{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := a.http.Do(req)
	if err != nil {
		return answerStats{}, fmt.Errorf("talking to the daemon: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return answerStats{}, responseError(resp)
	}
	var s answerStats
	first := true
	err = readSSE(resp.Body, func(data []byte) error {
		var ch streamChunk
		if err := json.Unmarshal(data, &ch); err != nil {
			return fmt.Errorf("bad event from the daemon: %w", err)
		}
		if ch.Error != nil {
			return errors.New(ch.Error.Message)
		}
		for _, c := range ch.Choices {
			if c.Delta.Content != "" || c.Delta.ReasoningContent != "" {
				if first {
					s.ttft, first = time.Since(start), false
				}
				out(c.Delta.Content, c.Delta.ReasoningContent)
			}
		}
		if u := ch.Usage; u != nil {
			s.promptTokens, s.completionTokens, s.cachedTokens = u.PromptTokens, u.CompletionTokens, u.PromptTokensDetails.CachedTokens
		}
		return nil
	})
	s.total = time.Since(start)
	return s, err
}

// streamChunk is the part of a chat.completion.chunk (or a text_completion
// chunk) that kiln's clients read.
type streamChunk struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content          string `json:"content"`
			ReasoningContent string `json:"reasoning_content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// readSSE calls fn with the data of each server-sent event until [DONE].
func readSSE(r io.Reader, fn func(data []byte) error) error {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadBytes('\n')
		if data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data:")); ok {
			data = bytes.TrimSpace(data)
			if string(data) == "[DONE]" {
				return nil
			}
			if ferr := fn(data); ferr != nil {
				return ferr
			}
		}
		if err == io.EOF {
			return errors.New("the stream ended before [DONE]")
		}
		if err != nil {
			return err
		}
	}
}

// responseError turns an error response (OpenAI's shape) into an error.
func responseError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &e) == nil && e.Error.Message != "" {
		return fmt.Errorf("%s (HTTP %d)", e.Error.Message, resp.StatusCode)
	}
	return fmt.Errorf("HTTP %s: %s", resp.Status, strings.TrimSpace(string(b)))
}

// readPrompt combines the prompt arguments with stdin when stdin is piped.
func readPrompt(args []string, stdin *os.File) (string, error) {
	prompt := strings.Join(args, " ")
	if !isTerminal(stdin) {
		in, err := io.ReadAll(stdin)
		if err != nil {
			return "", fmt.Errorf("reading stdin: %w", err)
		}
		if s := strings.TrimRight(string(in), "\n"); s != "" {
			if prompt == "" {
				prompt = s
			} else {
				prompt += "\n\n" + s
			}
		}
	}
	if strings.TrimSpace(prompt) == "" {
		return "", errors.New("no prompt: give one as an argument or pipe text to stdin")
	}
	return prompt, nil
}

func runOnce(args []string) error {
	var c clientFlags
	fs := flag.NewFlagSet("kiln run", flag.ContinueOnError)
	c.register(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: kiln run [flags] \"prompt\"   (stdin, when piped, is appended to the prompt)\n")
		fs.PrintDefaults()
	}
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if err := c.check(); err != nil {
		return err
	}
	setupLogging(c.verbose, slog.LevelWarn)
	prompt, err := readPrompt(pos, os.Stdin)
	if err != nil {
		return err
	}
	// Signals are caught only once the model is there: loading cannot be
	// cancelled, and Ctrl-C while weights load must still end the process.
	a, err := c.connect()
	if err != nil {
		return err
	}
	defer a.close()
	ctx, stopped := interruptible()
	var msgs []chat.Message
	if c.system != "" {
		msgs = append(msgs, chat.Message{Role: "system", Content: c.system})
	}
	msgs = append(msgs, chat.Message{Role: "user", Content: prompt})
	showReasoning := c.think && isTerminal(os.Stderr)
	stdout := bufio.NewWriter(os.Stdout)
	last := byte('\n')
	_, err = a.answer(ctx, &turn{messages: msgs, think: c.think, params: c.params()}, func(text, reasoning string) {
		if reasoning != "" && showReasoning {
			fmt.Fprint(os.Stderr, "\033[2m"+reasoning+"\033[0m")
		}
		if text != "" {
			stdout.WriteString(text)
			stdout.Flush()
			last = text[len(text)-1]
		}
	})
	if last != '\n' {
		stdout.WriteByte('\n')
	}
	stdout.Flush()
	if sig := stopped(); sig != nil {
		return sig
	}
	return err
}

// interruptible returns a context that Ctrl-C (SIGINT) or SIGTERM cancels,
// and a function that returns that signal, as an errSignal, once one came.
func interruptible() (context.Context, func() error) {
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		sig := <-sigs
		signal.Stop(sigs) // a second one ends the process at once
		cancel(errSignal{sig.(syscall.Signal)})
	}()
	return ctx, func() error {
		if ctx.Err() == nil {
			return nil
		}
		return context.Cause(ctx)
	}
}
