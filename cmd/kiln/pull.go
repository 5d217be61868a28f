package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kiln-llm/kiln/catalog"
	"github.com/kiln-llm/kiln/hub"
	"github.com/kiln-llm/kiln/model"
)

func init() {
	register(&command{
		name:    "pull",
		summary: "download a model from the Hugging Face hub into its shared cache: kiln pull Qwen/Qwen3-8B",
		run:     pullCmd,
	})
}

// newCatalog is the catalog of this environment ($HF_HUB_CACHE, HF_TOKEN,
// HF_ENDPOINT, HF_HUB_OFFLINE, $OLLAMA_MODELS); a checkpoint being pulled
// must have a config kiln loads before its weights are fetched.
func newCatalog() *catalog.Catalog {
	c := catalog.Default()
	c.Check = func(snapshot string) error {
		_, err := model.ReadConfig(os.DirFS(snapshot), filepath.Base(snapshot))
		return err
	}
	return c
}

// resolve turns --model into the path to load: a model of the Hugging Face
// cache or of Ollama's store, or a path. With --pull (kiln run, chat) a hub
// model not yet cached is downloaded first. The embedded demo model ("")
// needs nothing.
func (f *modelFlags) resolve() error {
	if f.dir == "" || f.resolved != nil {
		return nil
	}
	cat := newCatalog()
	m, err := cat.Resolve(f.dir)
	if nf := (*catalog.NotFoundError)(nil); errors.As(err, &nf) && nf.Hub && f.pull {
		if m, err = pull(cat, f.dir, hub.PullOptions{}); err != nil {
			return err
		}
		m, err = cat.Resolve(f.dir)
	}
	if err != nil {
		if f.offerPull && errors.As(err, new(*catalog.NotFoundError)) && strings.Contains(err.Error(), "kiln pull") {
			return fmt.Errorf("%w (or add --pull)", err)
		}
		return err
	}
	f.resolved, f.dir = m, m.Path
	if m.Source != catalog.FromPath {
		f.name = m.Name
	}
	return nil
}

// served is the served model's catalog entry under its API name (nil for
// the embedded demo model).
func (f *modelFlags) served(name string) *catalog.Model {
	if f.resolved == nil {
		return nil
	}
	m := *f.resolved
	m.Name = name
	return &m
}

// resolveModelPath is resolve for the commands that take --model without
// loading an engine (generate, bench, tokenize, render).
func resolveModelPath(ref string) (string, error) {
	f := modelFlags{dir: ref}
	err := f.resolve()
	return f.dir, err
}

func pullCmd(args []string) error {
	fs := flag.NewFlagSet("kiln pull", flag.ContinueOnError)
	verify := fs.Bool("verify", false, "hash the files already in the cache again and fetch any that changed")
	parallel := fs.Int("parallel", 8, "files downloaded at once")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: kiln pull [flags] MODEL...

Downloads models from the Hugging Face hub into its shared cache
($HF_HUB_CACHE, default ~/.cache/huggingface/hub), where transformers, vLLM
and hf download find them too; only the files kiln loads. MODEL is
ORG/NAME (a checkpoint), ORG/NAME:QUANT (a GGUF file of a GGUF repository;
Q4_K_M when left out), optionally @REVISION before the :QUANT.
An interrupted pull resumes where it stopped. HF_TOKEN authenticates gated
models, HF_ENDPOINT names a mirror, HF_HUB_OFFLINE=1 forbids requests.

`)
		fs.PrintDefaults()
	}
	names, err := modelArgs(fs, args)
	if err != nil {
		return err
	}
	if *parallel < 1 {
		return fmt.Errorf("--parallel must be at least 1, not %d", *parallel)
	}
	cat := newCatalog()
	cat.Hub.Parallel = *parallel
	for _, name := range names {
		m, err := pull(cat, name, hub.PullOptions{Verify: *verify})
		if err != nil {
			return err
		}
		fmt.Printf("run it: kiln run --model %s \"hello\"   (or serve it: kiln serve --model %s)\n", m.Name, m.Name)
	}
	return nil
}

// modelArgs parses a command's flags and the models it names, at least
// one.
func modelArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	names, err := parseInterspersed(fs, args)
	if err != nil {
		return nil, err
	}
	if len(names) == 0 {
		fs.Usage()
		fmt.Fprintln(fs.Output(), "\nno model named")
		return nil, errBadFlags{errors.New("no model named")}
	}
	return names, nil
}

// pull downloads one hub model with progress on stderr, and says where it
// is. Ctrl-C stops it resumably.
func pull(cat *catalog.Catalog, name string, opts hub.PullOptions) (*catalog.Model, error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	view := newPullView(os.Stderr, name)
	start := time.Now()
	m, p, err := cat.Pull(ctx, name, view.event)
	view.finish()
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("interrupted: the %s downloaded are kept in %s; `kiln pull %s` resumes", humanBytes(view.downloaded()), cat.Hub.Cache.Dir, name)
		}
		return nil, err
	}
	switch {
	case p.Offline != nil:
		fmt.Fprintf(os.Stderr, "%s is in the cache; the hub was not asked (%v)\n", m.Name, p.Offline)
	case p.Fetched == 0:
		fmt.Fprintf(os.Stderr, "%s is up to date in the cache (%s)\n", m.Name, humanBytes(m.Size))
	default:
		took := time.Since(start)
		fmt.Fprintf(os.Stderr, "pulled %s: %s in %s (%s/s)", m.Name, humanBytes(p.Fetched), took.Round(time.Millisecond), humanBytes(int64(float64(p.Fetched)/max(took.Seconds(), 1e-3))))
		if p.Resumed > 0 {
			fmt.Fprintf(os.Stderr, ", resuming %s from an earlier pull", humanBytes(p.Resumed))
		}
		fmt.Fprintln(os.Stderr)
	}
	for _, f := range p.Unverified {
		fmt.Fprintf(os.Stderr, "warning: the hub's ETag of %s is no digest; only its size was checked\n", f)
	}
	fmt.Fprintf(os.Stderr, "%s\n", m.Path)
	return m, nil
}

// pullView shows a pull's progress: on a terminal a bar per active file
// and one for the whole, redrawn in place, with a line for each file
// done; elsewhere (a log, a pipe) only those lines and retries.
type pullView struct {
	mu     sync.Mutex
	w      io.Writer
	tty    bool
	name   string
	files  []*hub.Event
	byName map[string]*hub.Event
	start  time.Time
	drawn  int // lines of the live area on screen
	last   time.Time
	base   int64 // bytes already on disk when the pull began
	status time.Time
}

func newPullView(f *os.File, name string) *pullView {
	now := time.Now()
	return &pullView{w: f, tty: isTerminal(f), name: name, byName: map[string]*hub.Event{}, start: now, status: now}
}

func (v *pullView) event(e hub.Event) {
	v.mu.Lock()
	defer v.mu.Unlock()
	cur, ok := v.byName[e.File]
	if !ok {
		cur = new(hub.Event)
		v.byName[e.File] = cur
		v.files = append(v.files, cur)
	}
	prev := *cur
	*cur = e
	// Bytes that were on disk already are no part of this pull's rate.
	if e.State == hub.Downloading && prev.State == hub.Queued || e.State == hub.Cached {
		v.base += e.Done
	}
	var line string
	switch e.State {
	case hub.Downloaded:
		line = fmt.Sprintf("%-40s %10s  downloaded, %s verified", e.File, humanBytes(e.Size), digestKind(e.Digest))
	case hub.Cached:
		line = fmt.Sprintf("%-40s %10s  already in the cache", e.File, humanBytes(e.Size))
	case hub.Failed:
		line = fmt.Sprintf("%-40s failed: %v", e.File, e.Err)
	case hub.Retrying:
		line = fmt.Sprintf("%-40s retrying: %v", e.File, e.Err)
	case hub.Waiting:
		line = fmt.Sprintf("%-40s waiting for another pull of the same file", e.File)
	}
	if line != "" {
		v.clear()
		fmt.Fprintln(v.w, line)
	}
	v.draw(line != "")
}

func digestKind(d string) string {
	switch len(d) {
	case 64:
		return "sha256"
	case 40:
		return "git blob id"
	}
	return "size"
}

// totals sums the files' sizes and bytes in hand.
func (v *pullView) totals() (done, size int64) {
	for _, f := range v.files {
		done += f.Done
		size += f.Size
	}
	return done, size
}

func (v *pullView) downloaded() int64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	done, _ := v.totals()
	return done
}

// clear erases the live area (a terminal only).
func (v *pullView) clear() {
	if v.tty && v.drawn > 0 {
		fmt.Fprintf(v.w, "\033[%dA\033[J", v.drawn)
		v.drawn = 0
	}
}

// draw redraws the live area at most every 100 ms (now: at once); off a
// terminal it writes a total line every ten seconds instead.
func (v *pullView) draw(now bool) {
	done, size := v.totals()
	rate := float64(done-v.base) / max(time.Since(v.start).Seconds(), 1e-3)
	if !v.tty {
		if time.Since(v.status) >= 10*time.Second && size > 0 && done < size {
			v.status = time.Now()
			fmt.Fprintf(v.w, "%s: %s of %s, %s/s\n", v.name, humanBytes(done), humanBytes(size), humanBytes(int64(rate)))
		}
		return
	}
	if !now && time.Since(v.last) < 100*time.Millisecond {
		return
	}
	v.last = time.Now()
	v.clear()
	lines := 0
	for _, f := range v.files {
		if f.State == hub.Downloading || f.State == hub.Verifying {
			label := f.File
			if len(label) > 38 {
				label = "..." + label[len(label)-35:]
			}
			fmt.Fprintf(v.w, "%-38s %s\n", label, bar(f.Done, f.Size, 24))
			lines++
		}
	}
	if size > 0 {
		eta := ""
		if rate > 0 && done < size {
			eta = "  " + time.Duration(float64(size-done)/rate*float64(time.Second)).Round(time.Second).String() + " left"
		}
		fmt.Fprintf(v.w, "%-38s %s  %s/s%s\n", v.name, bar(done, size, 24), humanBytes(int64(rate)), eta)
		lines++
	}
	v.drawn = lines
}

// bar is "[=====>    ]  45%  1.2 GB/2.6 GB".
func bar(done, total int64, width int) string {
	frac := 1.0
	if total > 0 {
		frac = min(float64(done)/float64(total), 1)
	}
	n := int(frac * float64(width))
	b := strings.Repeat("=", n)
	if n < width {
		b += ">" + strings.Repeat(" ", width-n-1)
	}
	return fmt.Sprintf("[%s] %3.0f%% %s/%s", b, frac*100, humanBytes(done), humanBytes(total))
}

func (v *pullView) finish() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.clear()
}
