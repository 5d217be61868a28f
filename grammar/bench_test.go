package grammar

import (
	"compress/gzip"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// syntheticVocab is a vocabulary of Qwen's size and make (151,643 byte
// strings and 293 special tokens in a 151,936-token model) for measuring
// masks: every byte; runs of spaces and indentation; punctuation runs,
// quotes included, some ending in newlines; CJK characters and pairs, and
// pieces of UTF-8 characters; the words of testdata's tokenizer corpus
// with and without a leading space; made-up words and word pieces. No real vocabulary
// of that size is at hand here; what a mask walks is the trie of these
// strings, which has the size and branching of a real one.
func syntheticVocab() *Vocab {
	const n, size = 151643, 151936
	r := rand.New(rand.NewPCG(7, 8))
	seen := map[string]bool{}
	var toks [][]byte
	add := func(s string) {
		if !seen[s] && len(toks) < n {
			seen[s] = true
			toks = append(toks, []byte(s))
		}
	}
	for b := range 256 {
		add(string([]byte{byte(b)}))
	}
	for i := 1; i <= 80; i++ {
		add(strings.Repeat(" ", i))
		add("\n" + strings.Repeat(" ", i))
		add(strings.Repeat("\t", 1+i%8))
		add(strings.Repeat("\n", 1+i%4))
	}
	for _, p := range []string{`": "`, `", "`, `": `, "\",\n", `"},`, `{"`, `"}`, `["`, `"]`, `": [`, `": {"`, `",`, `":`, `},`, `}]`, `"],`,
		`": ["`, `"],"`, `":"`, `","`, `":{"`, `":["`, "{\n", "\n}", "],\n", "},\n", ".\n", `@`, `.com`, `.edu`} {
		add(p)
		add(" " + p)
	}
	punct := []string{`"`, `'`, ",", ".", ":", ";", "(", ")", "[", "]", "{", "}", "=", "-", "_", "/", "\\", "*", "#", "!", "?", "<", ">", "&", "|", "+", "%", "@", "$", "`"}
	for len(toks) < 6000 {
		k := 1 + r.IntN(4)
		var sb strings.Builder
		if r.IntN(3) == 0 {
			sb.WriteByte(' ')
		}
		for range k {
			sb.WriteString(punct[r.IntN(len(punct))])
		}
		if r.IntN(5) == 0 {
			sb.WriteString("\n")
		}
		add(sb.String())
	}
	for len(toks) < 26000 {
		c := 0x4E00 + r.IntN(0x9FFF-0x4E00)
		s := string(rune(c))
		if r.IntN(2) == 0 {
			s += string(rune(0x4E00 + r.IntN(0x9FFF-0x4E00)))
		}
		add(s)
		if r.IntN(8) == 0 {
			add(s[:len(s)-1]) // a piece of a character
		}
	}
	// The words of an English and Python corpus, in the forms a BPE
	// vocabulary holds them, then made-up words to Qwen's size.
	corpus, err := os.Open("../testdata/tokenizer/corpus.txt.gz")
	if err != nil {
		panic(err)
	}
	defer corpus.Close()
	zr, err := gzip.NewReader(corpus)
	if err != nil {
		panic(err)
	}
	text, _ := io.ReadAll(zr)
	for _, w := range regexp.MustCompile(`[A-Za-z]{2,}`).FindAllString(string(text), -1) {
		add(w)
		add(" " + w)
		add(" " + strings.ToUpper(w[:1]) + w[1:])
	}
	cons, vow := "bcdfghjklmnprstvwxyz", "aeiou"
	word := func() string {
		var sb strings.Builder
		for range 1 + r.IntN(4) {
			sb.WriteByte(cons[r.IntN(len(cons))])
			sb.WriteByte(vow[r.IntN(len(vow))])
			if r.IntN(2) == 0 {
				sb.WriteByte(cons[r.IntN(len(cons))])
			}
		}
		return sb.String()
	}
	for len(toks) < n {
		w := word()
		switch r.IntN(6) {
		case 0:
			w = strings.ToUpper(w[:1]) + w[1:]
		case 1:
			w = w[:max(2, len(w)/2)] // a piece
		}
		if r.IntN(2) == 0 {
			w = " " + w
		}
		add(w)
	}
	return NewVocab(append(toks, make([][]byte, size-n)...), size)
}

const benchSchema = `{"type":"object","properties":{
	"name":{"type":"string","maxLength":40},
	"age":{"type":"integer","minimum":0,"maximum":150},
	"email":{"type":"string"},
	"role":{"enum":["admin","user","guest"]},
	"score":{"type":"number"},
	"tags":{"type":"array","items":{"type":"string","maxLength":16},"maxItems":5},
	"address":{"type":"object","properties":{"city":{"type":"string"},"zip":{"type":"string","minLength":5,"maxLength":5}},"required":["city"]},
	"active":{"type":"boolean"}},
	"required":["name","age","role","active"],"additionalProperties":false}`

// benchAnswers are answers to benchSchema as a model writes them; the
// first four warm a grammar up, the others are measured.
var benchAnswers = []string{
	`{"name": "Ada Lovelace", "age": 36, "email": "ada@example.com", "role": "admin", "score": 97.5, "tags": ["math", "poetry"], "address": {"city": "London", "zip": "W1J 7"}, "active": true}`,
	"{\n  \"name\": \"Alan Turing\",\n  \"age\": 41,\n  \"role\": \"user\",\n  \"tags\": [\"logic\"],\n  \"active\": false\n}",
	`{"name":"Grace Hopper","age":85,"email":"grace@navy.mil","role":"guest","score":88,"address":{"city":"Arlington"},"active":true}`,
	`{"name": "Edsger W. Dijkstra", "age": 72, "role": "user", "score": 91.25, "tags": ["graphs", "semaphores", "structured"], "active": true}`,
	`{"name": "Barbara Liskov", "age": 84, "email": "liskov@mit.edu", "role": "admin", "tags": ["abstraction", "distributed"], "address": {"city": "Cambridge", "zip": "02139"}, "active": true}`,
	"{\n  \"name\": \"Donald Knuth\",\n  \"age\": 86,\n  \"email\": \"knuth@cs.stanford.edu\",\n  \"role\": \"guest\",\n  \"score\": 100,\n  \"active\": true\n}",
	`{"name": "Margaret Hamilton", "age": 87, "role": "user", "score": 99.9, "tags": ["apollo", "software", "reliability"], "address": {"city": "Boston"}, "active": false}`,
	`{"name":"Ken Thompson","age":81,"email":"ken@bell-labs.com","role":"admin","score":95,"tags":["unix","go","utf-8"],"address":{"city":"Murray Hill","zip":"07974"},"active":true}`,
}

// tokenize splits text into the vocabulary's tokens, longest first.
func tokenize(v *Vocab, text string) []int32 {
	var ids []int32
	for i := 0; i < len(text); {
		node, best, n := int32(0), int32(-1), 0
		for j := i; j < len(text); j++ {
			next := int32(-1)
			nd := v.nodes[node]
			for _, e := range v.edges[nd.edges:nd.edgesEnd] {
				if e.b == text[j] {
					next = e.node
					break
				}
			}
			if next < 0 {
				break
			}
			node = next
			if c := v.nodes[node]; c.endsEnd > c.ends {
				best, n = v.ends[c.ends], j+1-i
			}
		}
		ids = append(ids, best)
		i += n
	}
	return ids
}

// BenchmarkMask measures the host's work per generated token of a
// constrained request on a vocabulary of Qwen's size, as the engine does
// it (clear the sequence's mask, fill it, look for a set bit), writing the
// answers a model would: for a schema seen for the first time (each new
// state's mask is a walk of the vocabulary) and for one whose grammar other
// answers have warmed up.
func BenchmarkMask(b *testing.B) {
	v := syntheticVocab()
	e, err := Schema([]byte(benchSchema))
	if err != nil {
		b.Fatal(err)
	}
	var answers [][]int32
	for _, a := range benchAnswers {
		answers = append(answers, tokenize(v, a))
	}
	for _, warm := range []bool{false, true} {
		b.Run(fmt.Sprintf("warm=%v", warm), func(b *testing.B) {
			g := Compile(e, v)
			if warm {
				for _, a := range answers[:4] {
					write(b, g, a)
				}
			}
			steps, elapsed := 0, time.Duration(0)
			for b.Loop() {
				if !warm {
					g = Compile(e, v)
				}
				for _, a := range answers[4:] {
					elapsed += write(b, g, a)
					steps += len(a) + 1
				}
			}
			b.ReportMetric(float64(elapsed.Nanoseconds())/1e3/float64(steps), "µs/token")
		})
	}
}

// write follows one answer through g and returns the time its masks took.
func write(b *testing.B, g *Grammar, answer []int32) time.Duration {
	mt := g.Matcher()
	mask := make([]uint64, g.v.words())
	start := time.Now()
	for i := 0; i <= len(answer); i++ {
		clear(mask)
		end := mt.Allow(answer[:i], mask)
		any := false
		for _, w := range mask {
			if w != 0 {
				any = true
				break
			}
		}
		if i < len(answer) && (!any || mask[answer[i]/64]>>(answer[i]%64)&1 == 0) || i == len(answer) && !end {
			b.Fatalf("answer refused after %d tokens", i)
		}
	}
	return time.Since(start)
}

// BenchmarkMaskBatch16 measures a step of 16 constrained sequences as the
// engine takes it (the sequences' masks at the same time, on as many cores
// as there are): 16 schemas of the same make, new and warmed up, each
// sequence writing one of the measured answers.
func BenchmarkMaskBatch16(b *testing.B) {
	v := syntheticVocab()
	var exprs []Expr
	var answers [][]int32
	for i := range 16 {
		key := fmt.Sprintf(`"name%d"`, i)
		e, err := Schema([]byte(strings.ReplaceAll(benchSchema, `"name"`, key)))
		if err != nil {
			b.Fatal(err)
		}
		exprs = append(exprs, e)
		answers = append(answers, tokenize(v, strings.ReplaceAll(benchAnswers[4+i%4], `"name"`, key)))
	}
	for _, warm := range []bool{false, true} {
		b.Run(fmt.Sprintf("warm=%v", warm), func(b *testing.B) {
			gs := make([]*Grammar, len(exprs))
			compile := func() {
				for i, e := range exprs {
					gs[i] = Compile(e, v)
				}
			}
			compile()
			if warm {
				for i, g := range gs {
					for _, a := range benchAnswers[:4] {
						write(b, g, tokenize(v, strings.ReplaceAll(a, `"name"`, fmt.Sprintf(`"name%d"`, i))))
					}
				}
			}
			steps, elapsed := 0, time.Duration(0)
			for b.Loop() {
				if !warm {
					compile()
				}
				s, d := batch(gs, answers)
				steps += s
				elapsed += d
			}
			b.ReportMetric(float64(elapsed.Nanoseconds())/1e3/float64(steps), "µs/step")
		})
	}
}

// batch follows answers[i] through gs[i] in lockstep, the masks of a step
// computed at once, and returns the steps and the time the masks took.
func batch(gs []*Grammar, answers [][]int32) (int, time.Duration) {
	mts := make([]*Matcher, len(gs))
	masks := make([][]uint64, len(gs))
	for i, g := range gs {
		mts[i], masks[i] = g.Matcher(), make([]uint64, g.v.words())
	}
	steps := 0
	var spent time.Duration
	for step := 0; ; step++ {
		start := time.Now()
		var wg sync.WaitGroup
		live := 0
		for i, a := range answers {
			if step > len(a) {
				continue
			}
			live++
			wg.Go(func() {
				clear(masks[i])
				mts[i].Allow(a[:step], masks[i])
			})
		}
		wg.Wait()
		if live == 0 {
			return steps, spent
		}
		spent += time.Since(start)
		steps++
	}
}

func TestSyntheticVocab(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a vocabulary of 151,643 tokens")
	}
	v := syntheticVocab()
	bytes := 0
	for _, tok := range v.tokens {
		bytes += len(tok)
	}
	t.Logf("%d tokens, %d bytes, %d trie nodes", len(v.tokens), bytes, len(v.nodes))
	for _, a := range benchAnswers {
		e, _ := Schema([]byte(benchSchema))
		g := Compile(e, v)
		if !g.Valid([]byte(a)) {
			t.Errorf("%s: not valid", a)
		}
		t.Logf("%d bytes in %d tokens", len(a), len(tokenize(v, a)))
	}
}
