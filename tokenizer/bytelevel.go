package tokenizer

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

// fromByteLevel maps a string of byte-level characters to the bytes they
// stand for; ok is false if a character is outside the alphabet.
func fromByteLevel(tok string) (raw string, ok bool) {
	out := make([]byte, 0, len(tok))
	for _, r := range tok {
		if r < 0 || int(r) >= len(runeToByte) || runeToByte[r] < 0 {
			return "", false
		}
		out = append(out, byte(runeToByte[r]))
	}
	return string(out), true
}

// byteLevelDecode turns one token string into bytes as HF's ByteLevel
// decoder does: the bytes its characters stand for or, if one is outside
// the alphabet (an added token with a space or a non-Latin character, say),
// the token's own UTF-8 bytes.
func byteLevelDecode(tok string) []byte {
	if raw, ok := fromByteLevel(tok); ok {
		return []byte(raw)
	}
	return []byte(tok)
}
