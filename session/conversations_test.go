package session

import (
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kiln-llm/kiln/chat"
	"github.com/kiln-llm/kiln/engine"
	"github.com/kiln-llm/kiln/internal/testmodel"
)

// TestConversations runs conversations of 8 turns through a server-shaped
// session whose caches are small enough to evict (KV blocks, snapshots,
// the state cache's memory and directory), with random edits: a new
// message, the previous answer edited or sent back with its reasoning, a
// regenerated reply, an edited earlier message, a changed system prompt.
// The engine restarts on the same state cache directory after the third
// and the sixth turn of every conversation. Every answer must equal a cold
// engine's greedy answer; after each phase no block or snapshot is held but
// by the caches, the directory stays within its budget, and after each
// Close nothing is held. 12 conversations per model by default (4 under the
// race detector, as scripts/test.sh runs it), 1,000 with
// KILN_ENGINE_MEASURE set:
//
//	KILN_ENGINE_MEASURE=1 go test -run TestConversations -v ./session
func TestConversations(t *testing.T) {
	n := 12
	if raceDetector {
		n = 4
	}
	if os.Getenv("KILN_ENGINE_MEASURE") != "" {
		n = 1000
	}
	for _, arch := range []string{"qwen3", "qwen3next"} {
		t.Run(arch, func(t *testing.T) {
			t.Parallel()
			conversations(t, arch, n)
		})
	}
}

// conversationBudget is the state cache directory's: a dozen 256-token
// chunks of the dense fixture's f32 KV.
const conversationBudget = 8 << 20

func conversations(t *testing.T, arch string, n int) {
	tmpl := testmodel.Options{ChatTemplate: "qwen3.jinja"}
	dir := t.TempDir()
	cold, f := newSession(t, arch, tmpl, engine.Options{NoCache: true, MaxRunning: 4}, Options{})
	opts := engine.Options{KVBlocks: 160, MaxRunning: 4, MaxBatchTokens: 96, SnapshotSlots: 4, StateMemory: int64(16 * f.Model.SlotBytes()),
		StateCache: engine.StateCache{Dir: dir, DiskBytes: conversationBudget, RAMBytes: 128 << 10, Model: arch}}
	convs := make([]*talk, n)
	for i := range convs {
		convs[i] = newTalk(uint64(i))
	}
	stats := map[string]int{}
	cached, prompted := 0, 0
	for phase, turns := range [][2]int{{0, 3}, {3, 6}, {6, 8}} { // an engine restart between
		s, _ := newSession(t, arch, tmpl, opts, Options{PrepareNextTurn: true})
		jobs := make(chan *talk)
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				// A failed request ends its worker (t.Fatal): the jobs
				// left go with it, so that the loop below does not wait
				// for workers that are gone.
				defer func() {
					for range jobs {
					}
				}()
				for c := range jobs {
					for turn := turns[0]; turn < turns[1]; turn++ {
						c.turn(t, s, cold, turn)
					}
				}
			})
		}
		for i := range convs {
			// Every other phase backwards: the first conversations are
			// then the last the state cache took, which it still holds.
			if phase%2 == 1 {
				i = len(convs) - 1 - i
			}
			jobs <- convs[i]
		}
		close(jobs)
		wg.Wait()
		s.turns.Wait()
		es := s.Engine().Stats()
		if es.Running+es.Waiting != 0 || es.KVBlocksUsed != es.KVBlocksCached || es.StateBytes > opts.StateMemory || es.StateOnDevice > opts.SnapshotSlots {
			t.Errorf("phase %d, idle: %+v", phase, es)
		}
		if phase > 0 && es.StateCacheRestores == 0 {
			t.Errorf("phase %d: nothing restored from the state cache after the restart", phase)
		}
		s.Close()
		if es := s.Engine().Stats(); es.KVBlocksUsed != 0 || es.StateSnapshots != 0 {
			t.Errorf("phase %d, closed: %d blocks, %d snapshots held", phase, es.KVBlocksUsed, es.StateSnapshots)
		}
		if b := treeBytes(t, dir); b > conversationBudget {
			t.Errorf("phase %d: the state cache directory holds %d bytes, over its budget of %d", phase, b, conversationBudget)
		}
	}
	for _, c := range convs {
		for k, v := range c.stats {
			stats[k] += v
		}
		cached, prompted = cached+c.cached, prompted+c.prompted
	}
	t.Logf("%d conversations: %v; %d of %d prompt tokens cached", n, stats, cached, prompted)
}

// talk is one conversation: its messages and what its turns did.
type talk struct {
	seed             uint64
	rng              *rand.Rand
	kwargs           map[string]any
	msgs, prev       []chat.Message // the next turn's, the last turn's
	answer           string
	stats            map[string]int
	cached, prompted int
}

var talkWords = strings.Fields("the sea waves tides fish rocks wind salt boats gulls shore deep blue cold light night")

func newTalk(seed uint64) *talk {
	c := &talk{seed: seed, rng: rand.New(rand.NewPCG(seed, 99)), stats: map[string]int{}}
	c.kwargs = map[string]any{"enable_thinking": c.rng.IntN(2) == 0}
	c.msgs = []chat.Message{{Role: "system", Content: "You answer about " + c.say(3) + "."}, {Role: "user", Content: c.say(20 + c.rng.IntN(60))}}
	return c
}

func (c *talk) say(n int) string {
	w := make([]string, n)
	for i := range w {
		w[i] = talkWords[c.rng.IntN(len(talkWords))]
	}
	return strings.Join(w, " ")
}

// turn changes the conversation at random (but for the first turn), runs
// it on s and on cold, and compares the answers.
func (c *talk) turn(t *testing.T, s, cold *Session, turn int) {
	if turn > 0 {
		var what string
		switch r := c.rng.IntN(10); {
		case r < 4:
			what = "next message"
			c.msgs = append(c.msgs, chat.Message{Role: "assistant", Content: c.answer}, chat.Message{Role: "user", Content: c.say(5 + c.rng.IntN(30))})
		case r < 6:
			what = "edited answer"
			a := c.answer
			if cut := c.rng.IntN(len(a) + 1); c.rng.IntN(2) == 0 {
				a = a[:cut] + " " + c.say(3) + a[cut:]
			} else {
				a = "<think>\n" + c.say(4) + "\n</think>\n\n" + a
			}
			c.msgs = append(c.msgs, chat.Message{Role: "assistant", Content: a}, chat.Message{Role: "user", Content: c.say(5 + c.rng.IntN(20))})
		case r < 8:
			what = "regenerated"
			c.msgs = slices.Clone(c.prev)
		case r < 9:
			what = "edited message"
			i := 1 + 2*c.rng.IntN(len(c.msgs)/2)
			c.msgs[i].Content = c.say(10 + c.rng.IntN(20))
		default:
			what = "changed system prompt"
			c.msgs[0].Content = "You answer about " + c.say(3) + "."
		}
		c.stats[what]++
	}
	req := &Request{Messages: slices.Clone(c.msgs), TemplateKwargs: c.kwargs, Sampling: engine.Sampling{MaxTokens: 4 + c.rng.IntN(12)}}
	got := generate(t, s, req)
	want := generate(t, cold, req)
	if !slices.Equal(got.tokens, want.tokens) {
		t.Errorf("conversation %d turn %d: %v, cold %v", c.seed, turn, got.tokens, want.tokens)
	}
	c.cached += got.final.Usage.CachedTokens
	c.prompted += got.final.Usage.PromptTokens
	c.prev, c.answer = slices.Clone(c.msgs), got.text
}

func treeBytes(t *testing.T, dir string) int64 {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err == nil {
			n += fi.Size()
		}
		return err
	})
	if err != nil {
		t.Fatal(fmt.Errorf("walking the state cache: %w", err))
	}
	return n
}
