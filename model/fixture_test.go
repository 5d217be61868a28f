package model

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/backend/cpu"
)

// The fixtures of testdata/fixtures, made by scripts/make_fixtures.py with
// transformers.
var fixtureNames = []string{"qwen3", "qwen3moe", "qwen3next", "qwen35", "qwen35moe", "qwen35vl"}

func fixtureDir(name string) string { return filepath.Join("..", "testdata", "fixtures", name) }

type reference struct {
	Architecture string `json:"architecture"`
	VocabSize    int    `json:"vocab_size"`
	Prompts      []struct {
		IDs           []int32   `json:"ids"`
		Argmax        []int32   `json:"argmax"`
		Margins       []float64 `json:"margins"`
		Greedy        []int32   `json:"greedy"`
		GreedyMargins []float64 `json:"greedy_margins"`
		MaxAbsLogit   float64   `json:"max_abs_logit"`
	} `json:"prompts"`
	logits [][]float32 // last-position logits per prompt
}

func readReference(t *testing.T, dir string) *reference {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var r reference
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "ref_logits.f32"))
	if err != nil {
		t.Fatal(err)
	}
	all := decodeF32(raw)
	if len(all) != len(r.Prompts)*r.VocabSize {
		t.Fatalf("ref_logits.f32 holds %d floats, want %d", len(all), len(r.Prompts)*r.VocabSize)
	}
	for i := range r.Prompts {
		r.logits = append(r.logits, all[i*r.VocabSize:(i+1)*r.VocabSize])
	}
	return &r
}

func decodeF32(raw []byte) []float32 {
	out := make([]float32, len(raw)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	return out
}

// readRows copies logits [R, V] to the host.
func readRows(t *testing.T, b backend.Backend, logits backend.Tensor) [][]float32 {
	t.Helper()
	shape := logits.Shape()
	raw := make([]byte, shape[0]*shape[1]*4)
	if err := b.Read(logits, raw); err != nil {
		t.Fatal(err)
	}
	all := decodeF32(raw)
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

// TestFixtures compares every fixture against transformers' fp32 outputs:
// last-position logits within 1e-3 * max(1, max|ref|), identical argmax at
// every prompt position, and identical greedy continuations up to the first
// step whose reference top-2 margin is within marginFloor.
func TestFixtures(t *testing.T) {
	for _, name := range fixtureNames {
		t.Run(name, func(t *testing.T) {
			dir := fixtureDir(name)
			ref := readReference(t, dir)
			b := cpu.New(cpu.Options{})
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
				last, want := rows[len(rows)-1], ref.logits[pi]
				var maxErr, maxRef float64
				for v := range want {
					maxErr = math.Max(maxErr, math.Abs(float64(last[v]-want[v])))
					maxRef = math.Max(maxRef, math.Abs(float64(want[v])))
				}
				worst = math.Max(worst, maxErr/math.Max(1, maxRef))
				if maxErr > 1e-3*math.Max(1, maxRef) {
					t.Errorf("prompt %d (%d tokens): max |logit - ref| = %.3g, allowed %.3g", pi, len(p.IDs), maxErr, 1e-3*math.Max(1, maxRef))
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
		})
	}
}
