package engine

import "strings"

// stopMatcher finds stop strings in streamed text. Text that could still
// turn out to be the start of a stop string is held back until the next
// piece decides it, so a stop string split across tokens is never emitted.
type stopMatcher struct {
	stops []string
	held  string
}

// any reports whether there are stop strings to look for.
func (m *stopMatcher) any() bool { return len(m.stops) > 0 }

// push adds a piece of text and returns what can be emitted, and whether a
// stop string was found (then nothing after it is emitted, ever).
func (m *stopMatcher) push(text string) (emit string, stopped bool) {
	if len(m.stops) == 0 {
		return text, false
	}
	buf := m.held + text
	cut := -1
	for _, s := range m.stops {
		if i := strings.Index(buf, s); i >= 0 && (cut < 0 || i < cut) {
			cut = i
		}
	}
	if cut >= 0 {
		m.held = ""
		return buf[:cut], true
	}
	keep := 0
	for _, s := range m.stops {
		// The longest suffix of buf that is a proper prefix of s.
		for n := min(len(s)-1, len(buf)); n > keep; n-- {
			if strings.HasSuffix(buf, s[:n]) {
				keep = n
				break
			}
		}
	}
	m.held = buf[len(buf)-keep:]
	return buf[:len(buf)-keep], false
}

// flush returns the text held back when the stream ends without a stop
// string.
func (m *stopMatcher) flush() string {
	h := m.held
	m.held = ""
	return h
}
