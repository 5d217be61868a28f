package engine

import "testing"

func TestStopMatcherAcrossPieces(t *testing.T) {
	cases := []struct {
		stops   []string
		pieces  []string
		want    string
		stopped bool
	}{
		{[]string{"STOP"}, []string{"ab", "cS", "TO", "Pxyz"}, "abc", true},
		{[]string{"STOP"}, []string{"ab", "cS", "TOx", "y"}, "abcSTOxy", false},
		{[]string{"\n\n", "END"}, []string{"a\n", "b\n", "\nc"}, "a\nb", true},
		{[]string{"aab"}, []string{"a", "a", "a", "b", "c"}, "a", true},
		{[]string{"xy", "abc"}, []string{"ab", "xy"}, "ab", true},
		{nil, []string{"a", "b"}, "ab", false},
	}
	for _, c := range cases {
		m := stopMatcher{stops: c.stops}
		got, stopped := "", false
		for _, p := range c.pieces {
			out, hit := m.push(p)
			got += out
			if hit {
				stopped = true
				break
			}
		}
		if !stopped {
			got += m.flush()
		}
		if got != c.want || stopped != c.stopped {
			t.Errorf("stops %q pieces %q: got %q stopped %v, want %q %v", c.stops, c.pieces, got, stopped, c.want, c.stopped)
		}
	}
}

// TestStopMatcherHoldsBackOnlyPrefixes checks that text is emitted as soon
// as it can no longer start a stop string.
func TestStopMatcherHoldsBackOnlyPrefixes(t *testing.T) {
	m := stopMatcher{stops: []string{"<end>"}}
	if out, _ := m.push("hello <e"); out != "hello " {
		t.Fatalf("emitted %q, want the text before the possible stop", out)
	}
	if out, _ := m.push("x"); out != "<ex" {
		t.Fatalf("emitted %q after the prefix broke, want %q", out, "<ex")
	}
}
