package tokenizer

import (
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// testdataDir holds the tokenizers and the ids and texts HF produced for
// them (scripts/make_tokenizer_cases.py).
const testdataDir = "../testdata/tokenizer"

var conformanceTokenizers = []string{"qwen3", "qwen35", "digits3", "gpt2"}

type hfCases struct {
	Encode []struct {
		Text    string  `json:"text"`
		IDs     []int32 `json:"ids"`
		Decoded string  `json:"decoded"`
	} `json:"encode"`
	Decode []struct {
		IDs  []int32 `json:"ids"`
		Text string  `json:"text"`
	} `json:"decode"`
}

func loadTestTokenizer(t testing.TB, name string) *Tokenizer {
	t.Helper()
	tok, err := Load(filepath.Join(testdataDir, name))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func loadCases(t testing.TB, name string) *hfCases {
	t.Helper()
	var c hfCases
	if err := json.Unmarshal(readGzip(t, filepath.Join(testdataDir, name, "cases.json.gz")), &c); err != nil {
		t.Fatal(err)
	}
	if len(c.Encode) < 1000 || len(c.Decode) < 100 {
		t.Fatalf("%s: only %d encode and %d decode cases", name, len(c.Encode), len(c.Decode))
	}
	return &c
}

func readGzip(t testing.TB, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestConformance requires the ids and texts HF produced, every one.
func TestConformance(t *testing.T) {
	for _, name := range conformanceTokenizers {
		t.Run(name, func(t *testing.T) {
			tok := loadTestTokenizer(t, name)
			c := loadCases(t, name)
			fails := 0
			for _, e := range c.Encode {
				got := tok.Encode(e.Text)
				if !slices.Equal(got, e.IDs) {
					fails++
					if fails <= 10 {
						t.Errorf("Encode(%q)\n got %v\nwant %v", e.Text, got, e.IDs)
					}
				}
				if d := tok.Decode(e.IDs); d != e.Decoded {
					fails++
					if fails <= 10 {
						t.Errorf("Decode(%v) = %q, want %q", e.IDs, d, e.Decoded)
					}
				}
			}
			for _, d := range c.Decode {
				if got := tok.Decode(d.IDs); got != d.Text {
					fails++
					if fails <= 10 {
						t.Errorf("Decode(%v) = %q, want %q", d.IDs, got, d.Text)
					}
				}
				if got := streamDecode(tok, d.IDs); got != d.Text {
					fails++
					if fails <= 10 {
						t.Errorf("streaming decode of %v = %q, want %q", d.IDs, got, d.Text)
					}
				}
			}
			if fails > 0 {
				t.Errorf("%d of %d cases differ from HF", fails, 2*len(c.Encode)+2*len(c.Decode))
			}
		})
	}
}

func streamDecode(tok *Tokenizer, ids []int32) string {
	d := tok.NewDecoder()
	var out string
	for _, id := range ids {
		out += d.Next(id)
	}
	return out + d.Flush()
}
