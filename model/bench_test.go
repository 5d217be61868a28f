package model

import (
	"testing"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/backend/cpu"
)

// BenchmarkDecodeQwen3_0_6B measures batch-1 decode of a synthetic
// Qwen3-0.6B (bf16 weights) on the CPU backend, after a 64-token prompt.
// Run: go test -run '^$' -bench DecodeQwen3 -benchtime 32x ./model
func BenchmarkDecodeQwen3_0_6B(b *testing.B) {
	m, err := Synthetic("qwen3-0.6b", cpu.New(cpu.Options{}), SyntheticOptions{Seed: 1, DType: backend.BF16})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	const prompt = 64
	steps := b.N
	blocks := blocksFor(0, prompt+steps, testBlockSize)
	if err := m.AllocCache(CacheSpec{Blocks: len(blocks), BlockSize: testBlockSize, Slots: 1}); err != nil {
		b.Fatal(err)
	}
	ids := make([]int32, prompt)
	for i := range ids {
		ids[i] = int32(i * 7)
	}
	if _, err := m.Forward([]Seq{{Tokens: ids, Blocks: blocks, Logits: LastLogits}}); err != nil {
		b.Fatal(err)
	}
	params := []backend.SampleParams{{}}
	tok := int32(1)
	b.ResetTimer()
	for i := range steps {
		l, err := m.Forward([]Seq{{Tokens: []int32{tok}, Pos: prompt + i, Blocks: blocks, Logits: LastLogits}})
		if err != nil {
			b.Fatal(err)
		}
		s, err := m.Sample(l, params)
		if err != nil {
			b.Fatal(err)
		}
		tok = s[0].Token
	}
	b.ReportMetric(float64(steps)/b.Elapsed().Seconds(), "tokens/s")
}
