package model

import (
	"math"
	"path/filepath"
	"testing"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/backend/cpu"
	"github.com/kiln-llm/kiln/model/reference"
)

func fixtureDir(name string) string { return filepath.Join("..", "testdata", "fixtures", name) }

func readReference(t *testing.T, dir string) *reference.Reference {
	t.Helper()
	r, err := reference.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// readRows copies logits [R, V] to the host.
func readRows(t *testing.T, b backend.Backend, logits backend.Tensor) [][]float32 {
	t.Helper()
	shape := logits.Shape()
	raw := make([]byte, shape[0]*shape[1]*4)
	if err := b.Read(logits, raw); err != nil {
		t.Fatal(err)
	}
	all := reference.DecodeF32(raw)
	rows := make([][]float32, shape[0])
	for i := range rows {
		rows[i] = all[i*shape[1] : (i+1)*shape[1]]
	}
	return rows
}

func argmax(x []float32) int32 {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return int32(best)
}

// blocksFor returns a block table of consecutive blocks from first covering n tokens.
func blocksFor(first, n, blockSize int) []int32 {
	var b []int32
	for i := 0; i*blockSize < n; i++ {
		b = append(b, int32(first+i))
	}
	return b
}

const (
	testBlockSize = 16
	greedyTokens  = 32
	marginFloor   = 1e-2 // greedy tokens must match where the reference margin exceeds this
)

// paths are the two ways a model runs its layers on a backend: through
// the fused operations the backend has (the CPU backend has them all), and
// as the model files write them, step by step (backend.Unfused).
var paths = []struct {
	name    string
	backend func() backend.Backend
}{
	{"fused", func() backend.Backend { return cpu.New(cpu.Options{}) }},
	{"steps", func() backend.Backend { return backend.Unfused(cpu.New(cpu.Options{})) }},
}

// TestFixtures compares every fixture against transformers' fp32 outputs,
// on both paths: last-position logits within 1e-3 * max(1, max|ref|),
// identical argmax at every prompt position, and identical greedy
// continuations up to the first step whose reference top-2 margin is
// within marginFloor.
func TestFixtures(t *testing.T) {
	for _, name := range reference.Fixtures {
		for _, path := range paths {
			t.Run(name+"/"+path.name, func(t *testing.T) { testFixture(t, name, path.backend()) })
		}
	}
}

func testFixture(t *testing.T, name string, b backend.Backend) {
	dir := fixtureDir(name)
	ref := readReference(t, dir)
	m, err := Load(dir, b, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.Config().Arch != ref.Architecture {
		t.Fatalf("architecture %s, reference says %s", m.Config().Arch, ref.Architecture)
	}
	if err := m.AllocCache(CacheSpec{Blocks: 128, BlockSize: testBlockSize, Slots: 4}); err != nil {
		t.Fatal(err)
	}
	worst := 0.0
	var compared []int
	for pi, p := range ref.Prompts {
		blocks := blocksFor(pi*24, len(p.IDs)+greedyTokens, testBlockSize)
		logits, err := m.Forward([]Seq{{Tokens: p.IDs, Blocks: blocks, Slot: pi, Logits: AllLogits}})
		if err != nil {
			t.Fatal(err)
		}
		rows := readRows(t, b, logits)
		if len(rows) != len(p.IDs) {
			t.Fatalf("prompt %d: %d logit rows for %d tokens", pi, len(rows), len(p.IDs))
		}
		for pos, row := range rows {
			if got := argmax(row); got != p.Argmax[pos] {
				t.Errorf("prompt %d position %d: argmax %d, reference %d (reference margin %.3g)", pi, pos, got, p.Argmax[pos], p.Margins[pos])
			}
		}
		last := rows[len(rows)-1]
		e := reference.MaxError(last, p.Logits)
		worst = math.Max(worst, e)
		if e > 1e-3 {
			t.Errorf("prompt %d (%d tokens): max |logit - ref| / max(1, max|ref|) = %.3g, allowed 1e-3", pi, len(p.IDs), e)
		}

		tok := argmax(last)
		pos := len(p.IDs)
		n := 0
		for i := 0; i < greedyTokens; i++ {
			if tok != p.Greedy[i] {
				if p.GreedyMargins[i] > marginFloor {
					t.Errorf("prompt %d greedy step %d: token %d, reference %d (margin %.3g)", pi, i, tok, p.Greedy[i], p.GreedyMargins[i])
				}
				break
			}
			n++
			if i == greedyTokens-1 {
				break
			}
			logits, err := m.Forward([]Seq{{Tokens: []int32{tok}, Pos: pos, Blocks: blocks, Slot: pi, Logits: LastLogits}})
			if err != nil {
				t.Fatal(err)
			}
			tok = argmax(readRows(t, b, logits)[0])
			pos++
		}
		compared = append(compared, n)
	}
	t.Logf("%s: max |logit - ref| / max(1, max|ref|) = %.3g; greedy tokens identical per prompt: %v of %d", name, worst, compared, greedyTokens)
}
