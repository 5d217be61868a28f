package tokenizer

// Decoder turns a stream of ids into text as the ids arrive. It holds back
// only the bytes of an unfinished UTF-8 character, so the concatenation of
// everything Next and Flush return equals Tokenizer.Decode of all the ids.
// A Decoder is not safe for concurrent use.
type Decoder struct {
	t       *Tokenizer
	pending []byte
	out     []byte
}

// NewDecoder returns a streaming decoder.
func (t *Tokenizer) NewDecoder() *Decoder { return &Decoder{t: t} }

// Next adds one id and returns the text it completes (possibly "").
func (d *Decoder) Next(id int32) string {
	if id < 0 || int(id) >= len(d.t.bytes) {
		return ""
	}
	d.pending = append(d.pending, d.t.bytes[id]...)
	var rest int
	d.out, rest = appendLossy(d.out[:0], d.pending, false)
	d.pending = append(d.pending[:0], d.pending[len(d.pending)-rest:]...)
	return string(d.out)
}

// Flush returns what is held back, an unfinished character as U+FFFD, and
// resets the decoder for a new sequence.
func (d *Decoder) Flush() string {
	var out []byte
	out, _ = appendLossy(nil, d.pending, true)
	d.pending = d.pending[:0]
	return string(out)
}
