package tokenizer

// Rust's String::from_utf8_lossy (which HF decode uses) replaces each maximal
// ill-formed subpart of the input with one U+FFFD, as the Unicode standard
// recommends. Go's own helpers replace per byte or per run, so the rule is
// written out here.

const replacement = "\uFFFD"

// seqLen reports how long the UTF-8 sequence starting with lead b is, and the
// allowed range of its second byte (narrower than 80..BF after E0, ED, F0,
// F4, which excludes overlongs, surrogates and values past U+10FFFF).
// n is 0 for a byte that cannot start a sequence.
func seqLen(b byte) (n int, lo, hi byte) {
	switch {
	case b < 0x80:
		return 1, 0, 0
	case b < 0xC2:
		return 0, 0, 0
	case b < 0xE0:
		return 2, 0x80, 0xBF
	case b == 0xE0:
		return 3, 0xA0, 0xBF
	case b == 0xED:
		return 3, 0x80, 0x9F
	case b < 0xF0:
		return 3, 0x80, 0xBF
	case b == 0xF0:
		return 4, 0x90, 0xBF
	case b < 0xF4:
		return 4, 0x80, 0xBF
	case b == 0xF4:
		return 4, 0x80, 0x8F
	}
	return 0, 0, 0
}

// scanUTF8 looks at the sequence starting at p[0]. It returns the number of
// bytes consumed and whether they form a valid character. If the bytes run
// out before an ill-formed byte shows up, incomplete is true: the result
// depends on what comes next.
func scanUTF8(p []byte) (size int, valid, incomplete bool) {
	n, lo, hi := seqLen(p[0])
	if n == 0 {
		return 1, false, false
	}
	for i := 1; i < n; i++ {
		if i >= len(p) {
			return i, false, true
		}
		c := p[i]
		if i == 1 {
			if c < lo || c > hi {
				return 1, false, false
			}
		} else if c < 0x80 || c > 0xBF {
			return i, false, false
		}
	}
	return n, true, false
}

// appendLossy appends p to dst with every maximal ill-formed subpart replaced
// by U+FFFD. If final is false, a trailing incomplete sequence is not
// written; rest is its length, to be carried into the next call.
func appendLossy(dst []byte, p []byte, final bool) (out []byte, rest int) {
	for i := 0; i < len(p); {
		if p[i] < 0x80 {
			dst = append(dst, p[i])
			i++
			continue
		}
		size, valid, incomplete := scanUTF8(p[i:])
		switch {
		case valid:
			dst = append(dst, p[i:i+size]...)
		case incomplete && !final:
			return dst, len(p) - i
		default:
			dst = append(dst, replacement...)
		}
		i += size
	}
	return dst, 0
}
