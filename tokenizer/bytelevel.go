package tokenizer

import "unicode/utf8"

// byteToRune is GPT-2's reversible byte-to-character table, the alphabet of
// every byte-level BPE: printable Latin-1 bytes stand for themselves, the
// other 68 bytes are moved to U+0100 and up in byte order.
var byteToRune [256]rune

// runeToByte inverts byteToRune; -1 marks characters outside the alphabet.
var runeToByte [324]int16

func init() {
	for i := range runeToByte {
		runeToByte[i] = -1
	}
	n := rune(0)
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			byteToRune[b] = rune(b)
		} else {
			byteToRune[b] = 256 + n
			n++
		}
		runeToByte[byteToRune[b]] = int16(b)
	}
}

// byteLevelString maps raw bytes to their byte-level characters.
func byteLevelString(b []byte) string {
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = utf8.AppendRune(out, byteToRune[c])
	}
	return string(out)
}

// byteLevelDecode turns one token string back into bytes as HF's ByteLevel
// decoder does: if every character is in the byte-level alphabet, the bytes
// they stand for; otherwise (an added token such as "<think>" written with
// characters outside it) the token's own UTF-8 bytes.
func byteLevelDecode(tok string) []byte {
	out := make([]byte, 0, len(tok))
	for _, r := range tok {
		if r < 0 || int(r) >= len(runeToByte) || runeToByte[r] < 0 {
			return []byte(tok)
		}
		out = append(out, byte(runeToByte[r]))
	}
	return out
}
