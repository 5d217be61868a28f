package tokenizer

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// Maximal-subpart replacement, the examples of the Unicode standard (ch. 3,
// "U+FFFD Substitution of Maximal Subparts") and the edges of Table 3-7.
func TestLossyMaximalSubparts(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64", "a\uFFFD\uFFFD\uFFFDb\uFFFDc\uFFFD\uFFFDd"},
		{"\xC0\xAF\xE0\x80\xBF\xF0\x81\x82\x41", "\uFFFD\uFFFD\uFFFD\uFFFD\uFFFD\uFFFD\uFFFD\uFFFDA"},
		{"\xED\xA0\x80\xED\xBF\xBF\xED\xAF\x41", "\uFFFD\uFFFD\uFFFD\uFFFD\uFFFD\uFFFD\uFFFD\uFFFDA"},
		{"\xF4\x91\x92\x93\xFF\x41\x80\xBF\x42", "\uFFFD\uFFFD\uFFFD\uFFFD\uFFFDA\uFFFD\uFFFDB"},
		{"\xE1\x80\xE2\xF0\x91\x92\xF1\xBF\x41", "\uFFFD\uFFFD\uFFFD\uFFFDA"},
		{"\xE2\x82", "\uFFFD"},
		{"\xF0\x9F\x98", "\uFFFD"},
		{"x\xF0\x9F\x98\x80", "x😀"},
		{"\xF4\x8F\xBF\xBF", "\U0010FFFF"},
		{"\xED\x9F\xBF", "\uD7FF"},
		{"\xEE\x80\x80", "\uE000"},
		{"\xC2\x80\xDF\xBF", "\u0080\u07FF"},
		{"\xC1\xBF", "\uFFFD\uFFFD"},
		{"\xF5\x80", "\uFFFD\uFFFD"},
	} {
		got, _ := appendLossy(nil, []byte(c.in), true)
		if string(got) != c.want {
			t.Errorf("lossy(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestLossyKeepsValidText(t *testing.T) {
	for _, s := range []string{"", "abc", "héllo wörld", "世界", "👩\u200d👩\u200d👧", "\u0000\u007f\uFFFD"} {
		got, _ := appendLossy(nil, []byte(s), true)
		if string(got) != s {
			t.Errorf("lossy(%q) = %q", s, got)
		}
	}
}

// chunkedLossy runs appendLossy over p in pieces as the streaming decoder
// does, carrying the incomplete tail.
func chunkedLossy(p []byte, cuts []int) string {
	var out, pending []byte
	prev := 0
	for _, c := range append(cuts, len(p)) {
		if c < prev || c > len(p) {
			continue
		}
		pending = append(pending, p[prev:c]...)
		prev = c
		var rest int
		out, rest = appendLossy(out, pending, false)
		pending = append(pending[:0], pending[len(pending)-rest:]...)
	}
	out, _ = appendLossy(out, pending, true)
	return string(out)
}

func FuzzLossyStreaming(f *testing.F) {
	f.Add([]byte("a\xF1\x80\x80\xE1\x80\xC2b"), uint8(3))
	f.Add([]byte("x😀y世界"), uint8(1))
	f.Add([]byte("\xE2\x82"), uint8(1))
	f.Fuzz(func(t *testing.T, p []byte, step uint8) {
		whole, _ := appendLossy(nil, p, true)
		if !utf8.Valid(whole) {
			t.Fatalf("lossy(%q) = %q is not valid UTF-8", p, whole)
		}
		if utf8.Valid(p) && string(whole) != string(p) {
			t.Fatalf("lossy changed valid %q to %q", p, whole)
		}
		var cuts []int
		for c := 0; c < len(p); c += int(step%7) + 1 {
			cuts = append(cuts, c)
		}
		if got := chunkedLossy(p, cuts); got != string(whole) {
			t.Fatalf("chunked lossy(%q) = %q, whole %q", p, got, whole)
		}
	})
}

// FuzzDecoderStreaming: the streaming decoder's output, concatenated, is
// the whole decode, and never splits a character.
func FuzzDecoderStreaming(f *testing.F) {
	tok := loadTestTokenizer(f, "qwen3")
	f.Add([]byte{1, 2, 3, 4, 5, 6})
	f.Add([]byte{0xff, 0x10, 0x00, 0x80, 0x20, 0x01})
	f.Fuzz(func(t *testing.T, raw []byte) {
		var ids []int32
		for i := 0; i+1 < len(raw); i += 2 {
			ids = append(ids, int32(int(raw[i])<<8|int(raw[i+1]))%int32(tok.VocabSize()+8))
		}
		d := tok.NewDecoder()
		var b strings.Builder
		for _, id := range ids {
			s := d.Next(id)
			if !utf8.ValidString(s) {
				t.Fatalf("Next(%d) = %q: not valid UTF-8", id, s)
			}
			b.WriteString(s)
		}
		b.WriteString(d.Flush())
		if want := tok.Decode(ids); b.String() != want {
			t.Fatalf("streamed %q, whole %q (ids %v)", b.String(), want, ids)
		}
	})
}

func TestDecoderHoldsBackPartialCharacters(t *testing.T) {
	tok := loadTestTokenizer(t, "qwen3")
	// 😀 is F0 9F 98 80: one byte token each.
	var ids []int32
	for _, b := range []byte("😀") {
		id, ok := tok.TokenID(string(byteToRune[b]))
		if !ok {
			t.Fatalf("no token for byte %#x", b)
		}
		ids = append(ids, id)
	}
	d := tok.NewDecoder()
	for i, id := range ids[:3] {
		if s := d.Next(id); s != "" {
			t.Fatalf("byte %d of 4 gave %q", i, s)
		}
	}
	if s := d.Next(ids[3]); s != "😀" {
		t.Fatalf("last byte gave %q", s)
	}
	d.Next(ids[0])
	if s := d.Flush(); s != "\uFFFD" {
		t.Fatalf("Flush of a lone lead byte = %q", s)
	}
	if s := d.Flush(); s != "" {
		t.Fatalf("second Flush = %q", s)
	}
}
