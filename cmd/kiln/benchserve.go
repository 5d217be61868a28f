package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kiln-llm/kiln/engine"
	"github.com/kiln-llm/kiln/server"
)

// kiln bench serve measures a serving endpoint the way vLLM's "vllm bench
// serve" does: requests arrive by a Poisson (or gamma, with burstiness)
// process or all at once, at most --max-concurrency at a time, each streamed;
// TTFT, TPOT, ITL and E2EL are measured at the client.

func init() { benchModes["serve"] = benchServe }

type benchConfig struct {
	model          modelFlags
	baseURL        string
	servedModel    string
	apiKey         string
	dataset        string
	numPrompts     int
	inputLen       int
	outputLen      int
	ignoreEOS      bool
	sampling       benchSampling
	rangeRatio     float64
	turns          int
	historyLen     int
	thinkTime      time.Duration
	requestRate    float64
	burstiness     float64
	maxConcurrency int
	percentiles    []float64
	goodput        map[string]float64
	vocab          int
	seed           uint64
	outputJSON     string
	verbose        bool
}

func parseBenchFlags(args []string) (*benchConfig, error) {
	c := &benchConfig{}
	fs := flag.NewFlagSet("kiln bench serve", flag.ContinueOnError)
	c.model.register(fs)
	c.model.registerSynthetic(fs)
	fs.StringVar(&c.baseURL, "base-url", "", "benchmark this OpenAI-compatible server (e.g. http://127.0.0.1:8000); default: start kiln in-process on a loopback port")
	fs.StringVar(&c.servedModel, "served-model-name", "", "model name to send (default: the first of GET /v1/models)")
	fs.StringVar(&c.apiKey, "api-key", os.Getenv("OPENAI_API_KEY"), "bearer token for --base-url (default $OPENAI_API_KEY)")
	fs.StringVar(&c.dataset, "dataset", "random", "workload: random (token-id prompts of --input-len on /v1/completions) or multiturn (chat conversations of --turns turns on /v1/chat/completions, each resending the history)")
	fs.IntVar(&c.numPrompts, "num-prompts", 100, "requests (random) or conversations (multiturn)")
	fs.IntVar(&c.inputLen, "input-len", 256, "prompt tokens per request (random) or new user tokens per turn, approximately (multiturn)")
	fs.IntVar(&c.outputLen, "output-len", 64, "most tokens generated per request")
	c.sampling.register(fs, "requests")
	fs.BoolVar(&c.ignoreEOS, "ignore-eos", true, "keep generating past end-of-sequence so that every answer has --output-len tokens (vLLM's ignore_eos)")
	fs.Float64Var(&c.rangeRatio, "range-ratio", 0, "lengths are drawn uniformly from [len*(1-r), len*(1+r)]")
	fs.IntVar(&c.turns, "turns", 4, "turns per conversation (multiturn)")
	fs.IntVar(&c.historyLen, "history-len", 0, "the first turn of each conversation also carries a document of about this many tokens, so that later turns follow that much history (multiturn)")
	fs.DurationVar(&c.thinkTime, "think-time", 0, "pause between a conversation's answer and its next turn, as a user reading and typing (multiturn)")
	rate := fs.String("request-rate", "inf", "requests per second: inf sends them all at once, a number draws gamma-distributed gaps (Poisson when --burstiness is 1)")
	fs.Float64Var(&c.burstiness, "burstiness", 1, "shape of the gamma arrival process: below 1 is burstier, above 1 more regular")
	fs.IntVar(&c.maxConcurrency, "max-concurrency", 0, "most requests (conversations) in flight at once; 0 is no limit")
	pcts := fs.String("percentiles", "99", "comma-separated percentiles to report")
	good := fs.String("goodput", "", "SLOs in ms for goodput, e.g. \"ttft:500 tpot:50 e2el:5000\"")
	fs.IntVar(&c.vocab, "vocab-size", 0, "random prompt token ids are drawn below this (default: the local tokenizer's regular vocabulary)")
	var seed int64
	fs.Int64Var(&seed, "seed", 0, "random seed of the workload")
	fs.StringVar(&c.outputJSON, "output-json", "", "also write the results, with per-request numbers, to this JSON file")
	fs.BoolVar(&c.verbose, "v", false, "log the in-process server's requests")
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	c.seed = uint64(seed)
	if *rate == "inf" {
		c.requestRate = math.Inf(1)
	} else if r, err := strconv.ParseFloat(*rate, 64); err != nil || r <= 0 {
		return nil, fmt.Errorf("--request-rate must be inf or a positive number, not %q", *rate)
	} else {
		c.requestRate = r
	}
	for _, p := range strings.Split(*pcts, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil || v < 0 || v > 100 {
			return nil, fmt.Errorf("--percentiles: %q is not a percentile", p)
		}
		c.percentiles = append(c.percentiles, v)
	}
	if *good != "" {
		c.goodput = map[string]float64{}
		for _, kv := range strings.Fields(*good) {
			k, v, ok := strings.Cut(kv, ":")
			ms, err := strconv.ParseFloat(v, 64)
			if !ok || err != nil || (k != "ttft" && k != "tpot" && k != "e2el") {
				return nil, fmt.Errorf("--goodput: %q is not ttft:MS, tpot:MS or e2el:MS", kv)
			}
			c.goodput[k] = ms
		}
	}
	if err := c.sampling.check(); err != nil {
		return nil, err
	}
	switch {
	case c.dataset != "random" && c.dataset != "multiturn":
		return nil, fmt.Errorf("--dataset must be random or multiturn, not %q", c.dataset)
	case c.thinkTime < 0:
		return nil, fmt.Errorf("--think-time must not be negative, not %v", c.thinkTime)
	case c.numPrompts < 1, c.inputLen < 1, c.outputLen < 1, c.turns < 1:
		return nil, errors.New("--num-prompts, --input-len, --output-len and --turns must be at least 1")
	case c.historyLen < 0:
		return nil, errors.New("--history-len must not be negative")
	case c.historyLen > 0 && c.dataset != "multiturn":
		return nil, errors.New("--history-len is for --dataset multiturn")
	case c.rangeRatio < 0 || c.rangeRatio >= 1:
		return nil, errors.New("--range-ratio must be in [0, 1)")
	case c.burstiness <= 0:
		return nil, errors.New("--burstiness must be positive")
	}
	return c, nil
}

func benchServe(args []string) error {
	c, err := parseBenchFlags(args)
	if err != nil {
		return err
	}
	// The report file is created first: a bad path fails now, not after
	// loading the model and running.
	var report *os.File
	written := false
	if c.outputJSON != "" {
		if report, err = os.Create(c.outputJSON); err != nil {
			return fmt.Errorf("--output-json: %w", err)
		}
		defer func() {
			report.Close()
			if !written { // no empty file left by a run that never ran
				os.Remove(c.outputJSON)
			}
		}()
	}
	level := slog.LevelWarn
	if c.verbose {
		level = slog.LevelInfo
	}
	setupLogging(false, level)
	if c.baseURL == "" {
		stop, err := c.startInProcess()
		if err != nil {
			return err
		}
		defer stop()
	}
	c.baseURL = strings.TrimRight(c.baseURL, "/")
	if strings.HasSuffix(c.baseURL, "/v1") {
		c.baseURL = strings.TrimSuffix(c.baseURL, "/v1")
	}
	cl := &benchClient{cfg: c, http: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}}}
	if c.servedModel == "" {
		if c.servedModel, err = cl.firstModel(); err != nil {
			return err
		}
	}
	if c.dataset == "random" && c.vocab <= 0 {
		return errors.New("--vocab-size is needed for random prompts against --base-url (kiln reads it from the model otherwise)")
	}
	fmt.Fprintf(os.Stderr, "benchmarking %s (model %s): %s workload, %d %s\n", c.baseURL, c.servedModel, c.dataset, c.numPrompts,
		map[string]string{"random": "requests", "multiturn": "conversations"}[c.dataset])
	res, err := cl.run()
	if err != nil {
		return err
	}
	res.print(os.Stdout, c)
	if report != nil {
		b, _ := json.MarshalIndent(res.jsonReport(c), "", "  ")
		if _, err := report.Write(append(b, '\n')); err != nil {
			return fmt.Errorf("--output-json: %w", err)
		}
		written = true
	}
	// A run that measured nothing fails, so that scripts notice.
	if m := res.metrics(c); m.completed == 0 {
		return fmt.Errorf("all %d requests failed (the errors are above)", m.failed)
	}
	return nil
}

// startInProcess loads the model and serves it on a loopback port.
func (c *benchConfig) startInProcess() (stop func(), err error) {
	c.model.conversations = true
	lm, err := c.model.load()
	if err != nil {
		return nil, err
	}
	if c.vocab <= 0 {
		c.vocab = lm.regularVocab()
	}
	srv := server.New(lm.sess, server.Options{ModelName: lm.name, Defaults: lm.defaults, TokenText: lm.tokenText, Logger: slog.Default()})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		lm.sess.Close()
		return nil, err
	}
	go srv.Serve(l)
	c.baseURL = "http://" + l.Addr().String()
	c.servedModel = lm.name
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		lm.sess.Close()
	}, nil
}

// requestResult is what the client saw of one request.
type requestResult struct {
	ok           bool
	err          string
	turn         int // multiturn: 0-based turn index
	start        time.Time
	ttft, e2el   time.Duration
	itl          []time.Duration
	promptTokens int
	cachedTokens int
	outputTokens int
}

// tpot is the mean time per output token after the first.
func (r *requestResult) tpot() time.Duration {
	if r.outputTokens < 2 {
		return 0
	}
	return (r.e2el - r.ttft) / time.Duration(r.outputTokens-1)
}

type benchClient struct {
	cfg  *benchConfig
	http *http.Client
}

func (cl *benchClient) firstModel() (string, error) {
	req, _ := http.NewRequest("GET", cl.cfg.baseURL+"/v1/models", nil)
	cl.auth(req)
	resp, err := cl.http.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", responseError(resp)
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || len(list.Data) == 0 {
		return "", fmt.Errorf("%s/v1/models lists no model; pass --served-model-name", cl.cfg.baseURL)
	}
	return list.Data[0].ID, nil
}

// engineStats reads the engine counters of a kiln server (/status); false
// for a server that is not kiln.
func (cl *benchClient) engineStats() (engine.Stats, bool) {
	req, _ := http.NewRequest("GET", cl.cfg.baseURL+"/status", nil)
	cl.auth(req)
	resp, err := cl.http.Do(req)
	if err != nil {
		return engine.Stats{}, false
	}
	defer resp.Body.Close()
	var st server.Status
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&st) != nil || st.Model == "" {
		return engine.Stats{}, false
	}
	return engine.Stats(st.Stats), true
}

func (cl *benchClient) auth(req *http.Request) {
	if cl.cfg.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+cl.cfg.apiKey)
	}
}

// stream sends one streaming request and measures it. text returns the
// generated text (for the next turn of a conversation).
func (cl *benchClient) stream(ctx context.Context, path string, body map[string]any) (r requestResult, text string) {
	body["model"] = cl.cfg.servedModel
	body["stream"] = true
	body["stream_options"] = map[string]bool{"include_usage": true}
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(ctx, "POST", cl.cfg.baseURL+path, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	// Replayable: net/http then sends the request again on a new
	// connection when the server closed the idle one it went out on before
	// answering (llama-server does, under load), which would count as a
	// failed request otherwise. The empty key is not sent.
	req.Header["Idempotency-Key"] = nil
	cl.auth(req)
	r.start = time.Now()
	resp, err := cl.http.Do(req)
	if err != nil {
		r.err = err.Error()
		return r, ""
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		r.err = responseError(resp).Error()
		return r, ""
	}
	var sb strings.Builder
	last := r.start
	chunks := 0
	err = readSSE(resp.Body, func(data []byte) error {
		var ch streamChunk
		if err := json.Unmarshal(data, &ch); err != nil {
			return err
		}
		if ch.Error != nil {
			return errors.New(ch.Error.Message)
		}
		if u := ch.Usage; u != nil {
			r.promptTokens, r.outputTokens, r.cachedTokens = u.PromptTokens, u.CompletionTokens, u.PromptTokensDetails.CachedTokens
		}
		for _, c := range ch.Choices {
			t := c.Text + c.Delta.ReasoningContent + c.Delta.Content
			if t == "" {
				continue
			}
			now := time.Now()
			if chunks == 0 {
				r.ttft = now.Sub(r.start)
			} else {
				r.itl = append(r.itl, now.Sub(last))
			}
			last = now
			chunks++
			sb.WriteString(c.Delta.Content + c.Text)
		}
		return nil
	})
	r.e2el = time.Since(r.start)
	if err != nil {
		r.err = err.Error()
		return r, ""
	}
	if r.outputTokens == 0 {
		r.outputTokens = chunks // a server that does not report usage
	}
	r.ok = chunks > 0
	switch {
	case !r.ok && r.outputTokens > 0:
		// TTFT and ITL time text; a model whose tokens decode to none (a
		// synthetic vocabulary of unused ids) cannot be timed.
		r.err = fmt.Sprintf("%d tokens generated but no text (the time to first token is the first text's; a file of kiln synth without --vocab-from has only unused ids beyond its bytes)", r.outputTokens)
	case !r.ok:
		r.err = "no tokens generated"
	}
	return r, sb.String()
}

// sampleLen draws a length from [n(1-r), n(1+r)].
func sampleLen(rng *rand.Rand, n int, r float64) int {
	lo, hi := int(math.Ceil(float64(n)*(1-r))), int(float64(n)*(1+r))
	if lo < 1 {
		lo = 1
	}
	if hi <= lo {
		return lo
	}
	return lo + rng.IntN(hi-lo+1)
}

// gamma draws from Gamma(shape, scale) (Marsaglia and Tsang).
func gamma(rng *rand.Rand, shape, scale float64) float64 {
	if shape < 1 {
		return gamma(rng, shape+1, scale) * math.Pow(rng.Float64(), 1/shape)
	}
	d := shape - 1.0/3
	c := 1 / math.Sqrt(9*d)
	for {
		x := rng.NormFloat64()
		v := 1 + c*x
		if v <= 0 {
			continue
		}
		v = v * v * v
		u := rng.Float64()
		if math.Log(u) < 0.5*x*x+d-d*v+d*math.Log(v) {
			return d * v * scale
		}
	}
}

// words make the multiturn workload's user messages.
var benchWords = strings.Fields(`the a of to in is for func return if err nil package import type struct
interface string int byte slice map range go chan select defer error value buffer reader writer file
read write open close server client request response handler context time duration test example
print format parse count index length size first last next loop check result data list key name`)

func (cl *benchClient) run() (*benchResults, error) {
	c := cl.cfg
	rng := rand.New(rand.NewPCG(c.seed, 0x6b696c6e))
	// A first request checks the endpoint and warms it; it is not counted.
	// A random workload's goes to the completions endpoint it uses: a chat
	// request would have kiln prepare its next turn during the run.
	var warm requestResult
	if c.dataset == "random" {
		warm, _ = cl.stream(context.Background(), "/v1/completions", map[string]any{"prompt": "hello", "max_tokens": 4, "ignore_eos": true})
	} else {
		warm, _ = cl.stream(context.Background(), "/v1/chat/completions", map[string]any{
			"messages": []map[string]string{{"role": "user", "content": "hello"}}, "max_tokens": 4, "ignore_eos": true})
	}
	if !warm.ok {
		return nil, fmt.Errorf("the warm-up request failed: %s", warm.err)
	}
	// Every job's inputs are drawn here, in order, so that a seed fixes the
	// workload whatever the timing.
	type job struct {
		promptIDs []int32
		turnLens  []int
		outLens   []int
	}
	jobs := make([]job, c.numPrompts)
	for i := range jobs {
		if c.dataset == "random" {
			ids := make([]int32, sampleLen(rng, c.inputLen, c.rangeRatio))
			for k := range ids {
				ids[k] = int32(rng.IntN(c.vocab))
			}
			jobs[i] = job{promptIDs: ids, outLens: []int{sampleLen(rng, c.outputLen, c.rangeRatio)}}
			continue
		}
		for range c.turns {
			jobs[i].turnLens = append(jobs[i].turnLens, sampleLen(rng, c.inputLen, c.rangeRatio))
			jobs[i].outLens = append(jobs[i].outLens, sampleLen(rng, c.outputLen, c.rangeRatio))
		}
	}
	var (
		mu      sync.Mutex
		results []requestResult
		wg      sync.WaitGroup
	)
	var sem chan struct{}
	if c.maxConcurrency > 0 {
		sem = make(chan struct{}, c.maxConcurrency)
	}
	record := func(r requestResult) {
		mu.Lock()
		results = append(results, r)
		mu.Unlock()
	}
	before, kiln := cl.engineStats()
	start := time.Now()
	for i, j := range jobs {
		if i > 0 && !math.IsInf(c.requestRate, 1) {
			time.Sleep(time.Duration(gamma(rng, c.burstiness, 1/(c.requestRate*c.burstiness)) * float64(time.Second)))
		}
		wrng := rand.New(rand.NewPCG(c.seed, uint64(i)+1))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if sem != nil {
				sem <- struct{}{}
				defer func() { <-sem }()
			}
			if c.dataset == "random" {
				body := c.sampling.request()
				body["prompt"], body["max_tokens"], body["ignore_eos"] = j.promptIDs, j.outLens[0], c.ignoreEOS
				r, _ := cl.stream(context.Background(), "/v1/completions", body)
				record(r)
				return
			}
			var history []map[string]string
			for t := range j.turnLens {
				if t > 0 {
					time.Sleep(c.thinkTime)
				}
				n := j.turnLens[t]
				if t == 0 {
					n += c.historyLen // a document the conversation is about
				}
				words := make([]string, n)
				for k := range words {
					words[k] = benchWords[wrng.IntN(len(benchWords))]
				}
				history = append(history, map[string]string{"role": "user", "content": strings.Join(words, " ")})
				body := c.sampling.request()
				body["messages"], body["max_tokens"], body["ignore_eos"] = history, j.outLens[t], c.ignoreEOS
				body["chat_template_kwargs"] = map[string]bool{"enable_thinking": false}
				r, answer := cl.stream(context.Background(), "/v1/chat/completions", body)
				r.turn = t
				record(r)
				if !r.ok {
					return
				}
				history = append(history, map[string]string{"role": "assistant", "content": answer})
			}
		}()
	}
	wg.Wait()
	res := &benchResults{results: results, duration: time.Since(start)}
	if after, ok := cl.engineStats(); kiln && ok {
		res.steps = stepsBetween(before, after)
	}
	return res, nil
}

type benchResults struct {
	results  []requestResult
	duration time.Duration
	steps    *engineSteps // kiln servers: the engine's passes during the run
}

// engineSteps is what a kiln server's forward passes did during the run.
type engineSteps struct {
	steps, tokens, decodeSteps, decodeTokens int64
	aheadSteps                               int64
	time, decodeTime, hostTime               time.Duration
}

func stepsBetween(a, b engine.Stats) *engineSteps {
	return &engineSteps{
		steps: b.Steps - a.Steps, tokens: b.StepTokens - a.StepTokens, time: b.StepTime - a.StepTime,
		decodeSteps: b.DecodeSteps - a.DecodeSteps, decodeTokens: b.DecodeTokens - a.DecodeTokens,
		decodeTime: b.DecodeStepTime - a.DecodeStepTime, hostTime: b.HostTime - a.HostTime,
		aheadSteps: b.AheadSteps - a.AheadSteps,
	}
}

// stepFigure is one figure of engineSteps: its JSON key, printed label and
// value.
type stepFigure struct {
	key, label string
	v          any
}

// summary gives where a serving run's time went on the server.
func (e *engineSteps) summary(duration time.Duration) []stepFigure {
	div := func(a, b float64) float64 {
		if b == 0 {
			return 0
		}
		return a / b
	}
	mixed, mixedTokens := e.steps-e.decodeSteps, e.tokens-e.decodeTokens
	return []stepFigure{
		{"forward_passes", "Forward passes", e.steps},
		{"decode_only_passes", "Decode-only passes", e.decodeSteps},
		{"mean_decode_only_pass_ms", "Mean decode-only pass (ms)", div(ms(e.decodeTime), float64(e.decodeSteps))},
		{"mean_decode_only_batch", "Mean decode-only batch", div(float64(e.decodeTokens), float64(e.decodeSteps))},
		{"decode_passes_ahead", "Decode passes issued ahead", e.aheadSteps},
		{"passes_with_prefill", "Passes with prefill", mixed},
		{"mean_pass_with_prefill_ms", "Mean pass with prefill (ms)", div(ms(e.time-e.decodeTime), float64(mixed))},
		{"mean_tokens_per_pass_with_prefill", "Mean tokens, pass with prefill", div(float64(mixedTokens), float64(mixed))},
		{"host_time_per_pass_ms", "Host time between passes, per pass (ms)", div(ms(e.hostTime), float64(e.steps))},
		{"time_in_passes_pct", "Time in passes (%)", div(100*float64(e.time), float64(duration))},
	}
}

// stat summarises one metric in milliseconds.
type stat struct {
	Mean, Median, Std float64
	Percentiles       map[string]float64
}

func summarize(ms []float64, pcts []float64) stat {
	s := stat{Percentiles: map[string]float64{}}
	if len(ms) == 0 {
		return s
	}
	sort.Float64s(ms)
	sum := 0.0
	for _, v := range ms {
		sum += v
	}
	s.Mean = sum / float64(len(ms))
	for _, v := range ms {
		s.Std += (v - s.Mean) * (v - s.Mean)
	}
	s.Std = math.Sqrt(s.Std / float64(len(ms)))
	s.Median = percentile(ms, 50)
	for _, p := range pcts {
		s.Percentiles[pctName(p)] = percentile(ms, p)
	}
	return s
}

// percentile interpolates linearly between the closest ranks of sorted
// data, as numpy.percentile does.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 1 {
		return sorted[0]
	}
	x := p / 100 * float64(len(sorted)-1)
	i := int(x)
	if i >= len(sorted)-1 {
		return sorted[len(sorted)-1]
	}
	return sorted[i] + (x-float64(i))*(sorted[i+1]-sorted[i])
}

func pctName(p float64) string { return "p" + strconv.FormatFloat(p, 'f', -1, 64) }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// metrics are the aggregate numbers of a run.
type metrics struct {
	completed, failed                                    int
	inputTokens, cachedTokens, outputTokens              int
	requestThroughput, outputThroughput, totalThroughput float64
	goodput                                              float64
	ttft, tpot, itl, e2el                                stat
	laterTurnTTFT, firstTurnTTFT                         stat
	laterTurnPrompt, laterTurnCached                     int
	laterTurns                                           int
}

// laterTurnHit is the share of later turns' prompt tokens served from the
// server's cache, in percent.
func (m *metrics) laterTurnHit() float64 {
	if m.laterTurnPrompt == 0 {
		return 0
	}
	return 100 * float64(m.laterTurnCached) / float64(m.laterTurnPrompt)
}

// laterTurnPromptMean is the mean prompt length of later turns: the
// history they follow.
func (m *metrics) laterTurnPromptMean() float64 {
	if m.laterTurns == 0 {
		return 0
	}
	return float64(m.laterTurnPrompt) / float64(m.laterTurns)
}

func (b *benchResults) metrics(c *benchConfig) metrics {
	var m metrics
	var ttft, tpot, itl, e2el, first, later []float64
	good := 0
	for _, r := range b.results {
		if !r.ok {
			m.failed++
			continue
		}
		m.completed++
		m.inputTokens += r.promptTokens
		m.cachedTokens += r.cachedTokens
		m.outputTokens += r.outputTokens
		ttft = append(ttft, ms(r.ttft))
		e2el = append(e2el, ms(r.e2el))
		if r.outputTokens > 1 {
			tpot = append(tpot, ms(r.tpot()))
		}
		for _, d := range r.itl {
			itl = append(itl, ms(d))
		}
		if r.turn == 0 {
			first = append(first, ms(r.ttft))
		} else {
			later = append(later, ms(r.ttft))
			m.laterTurns++
			m.laterTurnPrompt += r.promptTokens
			m.laterTurnCached += r.cachedTokens
		}
		if slo, ok := c.goodput["ttft"]; ok && ms(r.ttft) > slo {
			continue
		}
		if slo, ok := c.goodput["tpot"]; ok && ms(r.tpot()) > slo {
			continue
		}
		if slo, ok := c.goodput["e2el"]; ok && ms(r.e2el) > slo {
			continue
		}
		good++
	}
	sec := b.duration.Seconds()
	m.requestThroughput = float64(m.completed) / sec
	m.outputThroughput = float64(m.outputTokens) / sec
	m.totalThroughput = float64(m.inputTokens+m.outputTokens) / sec
	m.goodput = float64(good) / sec
	p := c.percentiles
	m.ttft, m.tpot, m.itl, m.e2el = summarize(ttft, p), summarize(tpot, p), summarize(itl, p), summarize(e2el, p)
	m.firstTurnTTFT, m.laterTurnTTFT = summarize(first, p), summarize(later, p)
	return m
}

func (b *benchResults) print(w io.Writer, c *benchConfig) {
	m := b.metrics(c)
	line := func(name string, v any) {
		switch v := v.(type) {
		case float64:
			fmt.Fprintf(w, "%-40s %-10.2f\n", name+":", v)
		default:
			fmt.Fprintf(w, "%-40s %-10v\n", name+":", v)
		}
	}
	head := func(title string) {
		pad := 50 - len(title)
		fmt.Fprintf(w, "%s%s%s\n", strings.Repeat("-", pad/2), title, strings.Repeat("-", pad-pad/2))
	}
	section := func(title, short string, s stat) {
		head(title)
		line("Mean "+short+" (ms)", s.Mean)
		line("Median "+short+" (ms)", s.Median)
		for _, p := range c.percentiles {
			line("P"+strconv.FormatFloat(p, 'f', -1, 64)+" "+short+" (ms)", s.Percentiles[pctName(p)])
		}
	}
	fmt.Fprintln(w, "============ Serving Benchmark Result ============")
	line("Successful requests", m.completed)
	line("Failed requests", m.failed)
	if c.maxConcurrency > 0 {
		line("Maximum request concurrency", c.maxConcurrency)
	}
	line("Request rate configured (RPS)", rateString(c.requestRate))
	if c.sampling.temperature > 0 {
		line("Sampling", c.sampling)
	}
	line("Benchmark duration (s)", b.duration.Seconds())
	line("Total input tokens", m.inputTokens)
	line("Total cached input tokens", m.cachedTokens)
	line("Total generated tokens", m.outputTokens)
	line("Request throughput (req/s)", m.requestThroughput)
	if c.goodput != nil {
		line("Request goodput (req/s)", m.goodput)
	}
	line("Output token throughput (tok/s)", m.outputThroughput)
	line("Total token throughput (tok/s)", m.totalThroughput)
	section("Time to First Token", "TTFT", m.ttft)
	section("Time per Output Token (excl. 1st token)", "TPOT", m.tpot)
	section("Inter-token Latency", "ITL", m.itl)
	section("End-to-end Latency", "E2EL", m.e2el)
	if c.dataset == "multiturn" {
		head("Multi-turn Conversation State")
		line("Mean TTFT, first turns (ms)", m.firstTurnTTFT.Mean)
		line("Mean TTFT, later turns (ms)", m.laterTurnTTFT.Mean)
		line("Median TTFT, later turns (ms)", m.laterTurnTTFT.Median)
		for _, p := range c.percentiles {
			line("P"+strconv.FormatFloat(p, 'f', -1, 64)+" TTFT, later turns (ms)", m.laterTurnTTFT.Percentiles[pctName(p)])
		}
		line("Mean later-turn prompt (tokens)", m.laterTurnPromptMean())
		line("Later-turn prompt tokens from cache (%)", m.laterTurnHit())
	}
	if b.steps != nil {
		head("Engine Steps (server)")
		for _, f := range b.steps.summary(b.duration) {
			line(f.label, f.v)
		}
	}
	fmt.Fprintln(w, strings.Repeat("=", 50))
	shown := 0
	for _, r := range b.results {
		if !r.ok && shown < 5 {
			fmt.Fprintf(w, "error: %s\n", r.err)
			shown++
		}
	}
}

// jsonReport is the --output-json document: the configuration, aggregate
// metrics and per-request numbers (ms).
func (b *benchResults) jsonReport(c *benchConfig) map[string]any {
	m := b.metrics(c)
	rep := map[string]any{
		"date": time.Now().UTC().Format(time.RFC3339), "base_url": c.baseURL, "model": c.servedModel,
		"dataset": c.dataset, "num_prompts": c.numPrompts, "input_len": c.inputLen, "output_len": c.outputLen,
		"range_ratio": c.rangeRatio, "turns": c.turns, "request_rate": rateString(c.requestRate),
		"burstiness": c.burstiness, "max_concurrency": c.maxConcurrency, "goodput_slos_ms": c.goodput,
		"sampling": c.sampling.request(),
		"duration": b.duration.Seconds(), "completed": m.completed, "failed": m.failed,
		"total_input_tokens": m.inputTokens, "total_cached_tokens": m.cachedTokens, "total_output_tokens": m.outputTokens,
		"request_throughput": m.requestThroughput, "request_goodput": m.goodput,
		"output_throughput": m.outputThroughput, "total_token_throughput": m.totalThroughput,
	}
	for name, s := range map[string]stat{"ttft": m.ttft, "tpot": m.tpot, "itl": m.itl, "e2el": m.e2el} {
		rep["mean_"+name+"_ms"], rep["median_"+name+"_ms"], rep["std_"+name+"_ms"] = s.Mean, s.Median, s.Std
		for k, v := range s.Percentiles {
			rep[k+"_"+name+"_ms"] = v
		}
	}
	if c.dataset == "multiturn" {
		rep["history_len"] = c.historyLen
		rep["mean_ttft_first_turn_ms"], rep["mean_ttft_later_turns_ms"] = m.firstTurnTTFT.Mean, m.laterTurnTTFT.Mean
		rep["median_ttft_later_turns_ms"] = m.laterTurnTTFT.Median
		for k, v := range m.laterTurnTTFT.Percentiles {
			rep[k+"_ttft_later_turns_ms"] = v
		}
		rep["later_turn_prompt_tokens"], rep["later_turn_cached_tokens"] = m.laterTurnPrompt, m.laterTurnCached
		rep["later_turn_cached_pct"] = m.laterTurnHit()
	}
	if b.steps != nil {
		steps := map[string]any{}
		for _, f := range b.steps.summary(b.duration) {
			steps[f.key] = f.v
		}
		rep["engine_steps"] = steps
	}
	var ttfts, e2els, inLens, outLens, cached []any
	var itls [][]float64
	var errs []string
	for _, r := range b.results {
		ttfts, e2els = append(ttfts, ms(r.ttft)), append(e2els, ms(r.e2el))
		inLens, outLens, cached = append(inLens, r.promptTokens), append(outLens, r.outputTokens), append(cached, r.cachedTokens)
		l := make([]float64, len(r.itl))
		for i, d := range r.itl {
			l[i] = ms(d)
		}
		itls = append(itls, l)
		errs = append(errs, r.err)
	}
	rep["ttfts"], rep["e2els"], rep["itls"], rep["input_lens"], rep["output_lens"], rep["cached_lens"], rep["errors"] =
		ttfts, e2els, itls, inLens, outLens, cached, errs
	return rep
}

func rateString(r float64) string {
	if math.IsInf(r, 1) {
		return "inf"
	}
	return strconv.FormatFloat(r, 'f', -1, 64)
}
