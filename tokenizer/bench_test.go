package tokenizer

import (
	"path/filepath"
	"strings"
	"testing"
)

// corpusLines reads the conformance corpus as lines, each keeping its line
// break, the way the HF side of the comparison encodes it.
func corpusLines(b *testing.B) ([]string, int64) {
	data := readGzip(b, filepath.Join(testdataDir, "corpus.txt.gz"))
	return strings.SplitAfter(string(data), "\n"), int64(len(data))
}

// BenchmarkEncodeCorpus: encode throughput over the corpus lines, one
// goroutine, word cache warm after the first pass.
func BenchmarkEncodeCorpus(b *testing.B) {
	lines, n := corpusLines(b)
	tok := loadTestTokenizer(b, "qwen3")
	b.SetBytes(n)
	b.ResetTimer()
	for range b.N {
		for _, l := range lines {
			tok.Encode(l)
		}
	}
}

// BenchmarkEncodeCorpusCold: the same with a fresh tokenizer (empty word
// cache) for every pass; loading is not timed.
func BenchmarkEncodeCorpusCold(b *testing.B) {
	lines, n := corpusLines(b)
	b.SetBytes(n)
	for range b.N {
		b.StopTimer()
		tok := loadTestTokenizer(b, "qwen3")
		b.StartTimer()
		for _, l := range lines {
			tok.Encode(l)
		}
	}
}

func BenchmarkLoad(b *testing.B) {
	for range b.N {
		loadTestTokenizer(b, "qwen3")
	}
}
