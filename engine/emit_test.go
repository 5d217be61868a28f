package engine

import (
	"context"
	"testing"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/internal/testmodel"
)

// BenchmarkEmit measures the scheduler goroutine's work per token of a chat
// answer once the token is sampled (detokenizing, stop strings, the event):
// the host work a pass adds per running sequence. The answer's parsing is
// the session's, in the reader's goroutine.
func BenchmarkEmit(b *testing.B) {
	f := loadFixture(b, "qwen3")
	e := &Engine{m: f.Model, tok: f.Tok, cfg: f.Model.Config(), opts: Options{KVBlocks: 4, Logger: testmodel.Logger()}}
	e.opts.setDefaults()
	s := newScheduler(e)
	reply := "<think>\nlet me see what the user wants here\n</think>\n\nHere is a Go function that reverses a string: it converts the string to runes, swaps them from both ends and returns the result. "
	ids := f.Tok.Encode(reply)
	prompt := f.Tok.Encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
	b.StopTimer()
	n := 0
	for range b.N {
		q, _ := e.prepare(&Request{Prompt: prompt, Sampling: Sampling{Stop: []string{"STOP"}}})
		q.ctx = context.Background()
		q.out = &Stream{notify: make(chan struct{}, 1)}
		q.stopWatch = func() bool { return true }
		b.StartTimer()
		for _, t := range ids {
			q.tokens = append(q.tokens, t)
			s.emit(q, backend.Sampled{Token: t})
		}
		b.StopTimer()
		n += len(ids)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/token")
}
