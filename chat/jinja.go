package chat

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// What gonja does differently from the Jinja that transformers runs, patched
// here: Python's string methods, json.dumps, None versus undefined, ordered
// dicts, and transformers' extra globals.

var globals = map[string]any{
	"strftime_now": strftimeNow,
}

var filters = map[string]exec.FilterFunction{
	"tojson":  filterToJSON,
	"items":   filterItems,
	"trim":    filterTrim,
	"default": filterDefault,
	"d":       filterDefault,
	"string":  filterString,
}

var tests = map[string]exec.TestFunction{
	"defined":   boolTest(func(v *exec.Value) bool { return !isUndefined(v) }),
	"undefined": boolTest(isUndefined),
	"none":      boolTest(isNone),
	"true":      boolTest(func(v *exec.Value) bool { return v.IsBool() && v.Bool() }),
	"false":     boolTest(func(v *exec.Value) bool { return v.IsBool() && !v.Bool() }),
	"boolean":   boolTest(func(v *exec.Value) bool { return v.IsBool() }),
	"string":    boolTest(func(v *exec.Value) bool { return v.IsString() }),
	"mapping":   boolTest(func(v *exec.Value) bool { return v.IsDict() }),
	"iterable":  boolTest(func(v *exec.Value) bool { return v.IsString() || v.IsList() || v.IsDict() }),
	"sequence":  boolTest(func(v *exec.Value) bool { return v.IsString() || v.IsList() || v.IsDict() }),
}

func boolTest(f func(*exec.Value) bool) func(*exec.Evaluator, *exec.Value, *exec.VarArgs) (bool, error) {
	return func(_ *exec.Evaluator, v *exec.Value, _ *exec.VarArgs) (bool, error) { return f(v), nil }
}

// args binds a call's arguments to Python parameter names (positional
// first, then by keyword); missing ones are nil.
func args(va *exec.VarArgs, names ...string) ([]*exec.Value, error) {
	if len(va.Args) > len(names) {
		return nil, fmt.Errorf("takes at most %d arguments (%d given)", len(names), len(va.Args))
	}
	out := make([]*exec.Value, len(names))
	copy(out, va.Args)
	for k, v := range va.KwArgs {
		i := indexOf(names, k)
		if i < 0 {
			return nil, fmt.Errorf("got an unexpected keyword argument '%s'", k)
		}
		if out[i] != nil {
			return nil, fmt.Errorf("got multiple values for argument '%s'", k)
		}
		out[i] = v
	}
	return out, nil
}

func indexOf(names []string, k string) int {
	for i, n := range names {
		if n == k {
			return i
		}
	}
	return -1
}

// given reports whether an optional argument was passed and is not None.
func given(v *exec.Value) bool { return v != nil && !v.IsNil() }

func errValue(format string, a ...any) *exec.Value {
	return exec.AsValue(fmt.Errorf(format, a...))
}

// filterToJSON is transformers' tojson: json.dumps(x, ensure_ascii=False,
// indent=None, separators=None, sort_keys=False).
func filterToJSON(e *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	a, err := args(params, "ensure_ascii", "indent", "separators", "sort_keys")
	if err != nil {
		return errValue("tojson: %v", err)
	}
	b := budgetOf(e.Environment.Context)
	o := newDumpOptions()
	o.limit = b.lim.Output
	o.ensureASCII = given(a[0]) && a[0].IsTrue()
	o.sortKeys = given(a[3]) && a[3].IsTrue()
	if given(a[1]) {
		o.hasIndent, o.itemSep = true, ","
		switch {
		case a[1].IsInteger():
			o.indent = strings.Repeat(" ", min(max(a[1].Integer(), 0), o.limit+1))
		case a[1].IsString():
			o.indent = a[1].String()
		default:
			return errValue("tojson: indent must be an integer or a string")
		}
	}
	if given(a[2]) {
		if !a[2].IsList() || a[2].Len() != 2 {
			return errValue("tojson: separators must be a pair of strings")
		}
		o.itemSep, o.keySep = a[2].Index(0).String(), a[2].Index(1).String()
	}
	s, err := pyDumps(in, o)
	if errors.Is(err, errTooBig) {
		b.fail("tojson would print more than %d bytes", o.limit)
	}
	if err != nil {
		return exec.AsValue(err)
	}
	b.build(len(s))
	return exec.AsSafeValue(s)
}

// filterItems is Jinja's items: a mapping's (key, value) pairs in order.
func filterItems(_ *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	if isUndefined(in) {
		return exec.AsValue(pyList{})
	}
	pairs, ok := dictPairs(in)
	if !ok {
		return exec.AsValue(errors.New("Can only get item pairs from a mapping."))
	}
	out := make(pyList, len(pairs))
	for i, p := range pairs {
		out[i] = pyList{p.Key, p.Value}
	}
	return exec.AsValue(out)
}

// orderedPairs is the pairs of an ordered dict (gonja's Dict).
func orderedPairs(v *exec.Value) ([]*exec.Pair, bool) {
	switch d := v.Interface().(type) {
	case *exec.Dict:
		return d.Pairs, true
	case exec.Dict:
		return d.Pairs, true
	}
	return nil, false
}

// dictPairs lists a mapping's entries in Python's order (insertion order;
// gonja's own maps, such as namespaces, sorted).
func dictPairs(v *exec.Value) ([]*exec.Pair, bool) {
	if pairs, ok := orderedPairs(v); ok {
		return pairs, true
	}
	if !v.IsDict() {
		return nil, false
	}
	var pairs []*exec.Pair
	for _, k := range v.Keys() {
		val, _ := v.GetItem(k.Interface())
		pairs = append(pairs, &exec.Pair{Key: k, Value: val})
	}
	return pairs, true
}

func filterTrim(_ *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	a, err := args(params, "chars")
	if err != nil {
		return errValue("trim: %v", err)
	}
	return exec.AsValue(pyStrip(pyStr(in), a[0], true, true))
}

// filterDefault is Jinja's default: only an undefined value (or, with
// boolean=true, a falsy one) is replaced; None is kept.
func filterDefault(_ *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	a, err := args(params, "default_value", "boolean")
	if err != nil {
		return errValue("default: %v", err)
	}
	def := a[0]
	if def == nil {
		def = exec.AsValue("")
	}
	if isUndefined(in) || in.IsError() || (given(a[1]) && a[1].IsTrue() && !in.IsTrue()) {
		return def
	}
	return in
}

func filterString(_ *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	if isUndefined(in) {
		return exec.AsValue("")
	}
	return exec.AsValue(pyStr(in))
}

// strftimeNow is transformers' strftime_now(format): the local time now,
// formatted with Python's strftime directives.
func strftimeNow(format string) string { return strftime(time.Now(), format) }

func strftime(t time.Time, format string) string {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' || i+1 == len(format) {
			b.WriteByte(c)
			continue
		}
		i++
		switch format[i] {
		case 'Y':
			fmt.Fprintf(&b, "%d", t.Year())
		case 'y':
			fmt.Fprintf(&b, "%02d", t.Year()%100)
		case 'm':
			fmt.Fprintf(&b, "%02d", int(t.Month()))
		case 'd':
			fmt.Fprintf(&b, "%02d", t.Day())
		case 'e':
			fmt.Fprintf(&b, "%2d", t.Day())
		case 'H':
			fmt.Fprintf(&b, "%02d", t.Hour())
		case 'I':
			fmt.Fprintf(&b, "%02d", (t.Hour()+11)%12+1)
		case 'M':
			fmt.Fprintf(&b, "%02d", t.Minute())
		case 'S':
			fmt.Fprintf(&b, "%02d", t.Second())
		case 'f':
			fmt.Fprintf(&b, "%06d", t.Nanosecond()/1000)
		case 'p':
			b.WriteString(t.Format("PM"))
		case 'B':
			b.WriteString(t.Month().String())
		case 'b', 'h':
			b.WriteString(t.Month().String()[:3])
		case 'A':
			b.WriteString(t.Weekday().String())
		case 'a':
			b.WriteString(t.Weekday().String()[:3])
		case 'w':
			fmt.Fprintf(&b, "%d", int(t.Weekday()))
		case 'j':
			fmt.Fprintf(&b, "%03d", t.YearDay())
		case 'Z':
			name, _ := t.Zone()
			b.WriteString(name)
		case 'z':
			b.WriteString(t.Format("-0700"))
		case 'F':
			b.WriteString(t.Format("2006-01-02"))
		case 'T':
			b.WriteString(t.Format("15:04:05"))
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			b.WriteByte(format[i])
		}
	}
	return b.String()
}

// pyIsSpace is Python's str.isspace for one character.
func pyIsSpace(r rune) bool { return unicode.IsSpace(r) || (r >= 0x1c && r <= 0x1f) }

// pyStrip is str.strip/lstrip/rstrip: chars nil or None strips whitespace.
func pyStrip(s string, chars *exec.Value, left, right bool) string {
	cut := pyIsSpace
	if given(chars) {
		set := chars.String()
		cut = func(r rune) bool { return strings.ContainsRune(set, r) }
	}
	if left {
		s = strings.TrimLeftFunc(s, cut)
	}
	if right {
		s = strings.TrimRightFunc(s, cut)
	}
	return s
}

// pySplit is str.split (fromRight false) and str.rsplit (true).
func pySplit(s string, sep *exec.Value, maxsplit int, fromRight bool) (pyList, error) {
	var parts []string
	if !given(sep) {
		parts = splitSpace(s, maxsplit, fromRight)
	} else {
		sp := sep.String()
		if sp == "" {
			return nil, errors.New("ValueError: empty separator")
		}
		parts = splitSep(s, sp, maxsplit, fromRight)
	}
	out := make(pyList, len(parts))
	for i, p := range parts {
		out[i] = p
	}
	return out, nil
}

func splitSep(s, sep string, maxsplit int, fromRight bool) []string {
	if maxsplit < 0 {
		return strings.Split(s, sep)
	}
	if !fromRight {
		return strings.SplitN(s, sep, maxsplit+1)
	}
	var rev []string
	for len(rev) < maxsplit {
		i := strings.LastIndex(s, sep)
		if i < 0 {
			break
		}
		rev = append(rev, s[i+len(sep):])
		s = s[:i]
	}
	out := []string{s}
	for i := len(rev) - 1; i >= 0; i-- {
		out = append(out, rev[i])
	}
	return out
}

// splitSpace splits on runs of whitespace, dropping empty strings; after
// maxsplit splits the rest is one field with its outer whitespace (on the
// split side) removed, as Python does.
func splitSpace(s string, maxsplit int, fromRight bool) []string {
	if fromRight {
		r := []rune(s)
		for i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 {
			r[i], r[j] = r[j], r[i]
		}
		parts := splitSpace(string(r), maxsplit, false)
		for i, j := 0, len(parts)-1; i < j; i, j = i+1, j-1 {
			parts[i], parts[j] = parts[j], parts[i]
		}
		for i, p := range parts {
			pr := []rune(p)
			for a, b := 0, len(pr)-1; a < b; a, b = a+1, b-1 {
				pr[a], pr[b] = pr[b], pr[a]
			}
			parts[i] = string(pr)
		}
		return parts
	}
	var out []string
	for {
		s = strings.TrimLeftFunc(s, pyIsSpace)
		if s == "" {
			return out
		}
		if maxsplit >= 0 && len(out) == maxsplit {
			return append(out, s)
		}
		end := strings.IndexFunc(s, pyIsSpace)
		if end < 0 {
			return append(out, s)
		}
		out = append(out, s[:end])
		s = s[end:]
	}
}

// pySlice clamps Python slice bounds [start:end] to a length n.
func pySlice(n int, start, end *exec.Value) (int, int) {
	lo, hi := 0, n
	if given(start) {
		lo = clampIndex(start.Integer(), n)
	}
	if given(end) {
		hi = clampIndex(end.Integer(), n)
	}
	return lo, hi
}

func clampIndex(i, n int) int {
	if i < 0 {
		i += n
	}
	return max(0, min(i, n))
}

// runeSpan is s[lo:hi] in characters.
func runeSpan(s string, lo, hi int) string {
	start, end, n := len(s), len(s), 0
	for i := range s {
		if n == lo {
			start = i
		}
		if n == hi {
			end = i
			break
		}
		n++
	}
	return s[start:end]
}

// affixTest is str.startswith / str.endswith: the affix may be a tuple.
func affixTest(self string, va *exec.VarArgs, match func(s, affix string) bool) (any, error) {
	a, err := args(va, "prefix", "start", "end")
	if err != nil {
		return nil, err
	}
	if a[0] == nil {
		return nil, errors.New("takes at least 1 argument (0 given)")
	}
	s := self
	if given(a[1]) || given(a[2]) {
		// Python's bounds count characters; the string is not copied (a
		// prompt's message can be megabytes, and Qwen's templates test
		// every message).
		n := utf8.RuneCountInString(self)
		lo, hi := pySlice(n, a[1], a[2])
		if lo > hi || given(a[1]) && a[1].Integer() > n { // Python: a start past the end matches nothing, not even ""
			return false, nil
		}
		s = runeSpan(self, lo, hi)
	}
	if a[0].IsList() {
		for i := 0; i < a[0].Len(); i++ {
			if match(s, a[0].Index(i).String()) {
				return true, nil
			}
		}
		return false, nil
	}
	if !a[0].IsString() {
		return nil, fmt.Errorf("argument must be str or a tuple of str, not %s", a[0].Val.Kind())
	}
	return match(s, a[0].String()), nil
}

type strMethod = exec.Method[string]

func stripMethod(left, right bool) strMethod {
	return func(self string, _ *exec.Value, va *exec.VarArgs) (any, error) {
		a, err := args(va, "chars")
		if err != nil {
			return nil, err
		}
		return pyStrip(self, a[0], left, right), nil
	}
}

func splitMethod(fromRight bool) strMethod {
	return func(self string, _ *exec.Value, va *exec.VarArgs) (any, error) {
		a, err := args(va, "sep", "maxsplit")
		if err != nil {
			return nil, err
		}
		maxsplit := -1
		if given(a[1]) {
			maxsplit = a[1].Integer()
		}
		return pySplit(self, a[0], maxsplit, fromRight)
	}
}

var strMethods = map[string]strMethod{
	"strip":  stripMethod(true, true),
	"lstrip": stripMethod(true, false),
	"rstrip": stripMethod(false, true),
	"split":  splitMethod(false),
	"rsplit": splitMethod(true),
	"startswith": func(self string, _ *exec.Value, va *exec.VarArgs) (any, error) {
		return affixTest(self, va, strings.HasPrefix)
	},
	"endswith": func(self string, _ *exec.Value, va *exec.VarArgs) (any, error) {
		return affixTest(self, va, strings.HasSuffix)
	},
	"replace": func(self string, _ *exec.Value, va *exec.VarArgs) (any, error) {
		a, err := args(va, "old", "new", "count")
		if err != nil {
			return nil, err
		}
		if a[0] == nil || a[1] == nil {
			return nil, errors.New("replace expected at least 2 arguments")
		}
		n := -1
		if given(a[2]) {
			n = a[2].Integer()
		}
		return strings.Replace(self, a[0].String(), a[1].String(), n), nil
	},
}

// dictMethods are the mapping methods, in the dict's own order.
var dictMethods = map[string]exec.Method[map[string]any]{
	"items": func(_ map[string]any, self *exec.Value, va *exec.VarArgs) (any, error) {
		return dictView(self, va, func(p *exec.Pair) any { return pyList{p.Key, p.Value} })
	},
	"keys": func(_ map[string]any, self *exec.Value, va *exec.VarArgs) (any, error) {
		return dictView(self, va, func(p *exec.Pair) any { return p.Key })
	},
	"values": func(_ map[string]any, self *exec.Value, va *exec.VarArgs) (any, error) {
		return dictView(self, va, func(p *exec.Pair) any { return p.Value })
	},
	"copy": func(_ map[string]any, self *exec.Value, va *exec.VarArgs) (any, error) {
		if len(va.Args)+len(va.KwArgs) > 0 {
			return nil, errors.New("takes no arguments")
		}
		pairs, _ := dictPairs(self)
		if len(pairs) == 0 {
			return map[string]any{}, nil
		}
		return &exec.Dict{Pairs: slices.Clone(pairs)}, nil
	},
	"get": func(_ map[string]any, self *exec.Value, va *exec.VarArgs) (any, error) {
		a, err := args(va, "key", "default")
		if err != nil {
			return nil, err
		}
		if a[0] == nil {
			return nil, errors.New("get expected at least 1 argument, got 0")
		}
		pairs, _ := dictPairs(self)
		for _, p := range pairs {
			if p.Key.EqualValueTo(a[0]) {
				return p.Value, nil
			}
		}
		if a[1] == nil {
			return none, nil
		}
		return a[1], nil
	},
}

// listMethods are the list methods that do not mutate (transformers'
// sandbox refuses the others).
var listMethods = map[string]exec.Method[[]any]{
	"copy": func(_ []any, self *exec.Value, va *exec.VarArgs) (any, error) {
		if len(va.Args)+len(va.KwArgs) > 0 {
			return nil, errors.New("takes no arguments")
		}
		out := make(pyList, self.Len())
		for i := range out {
			out[i] = self.Index(i).Interface()
		}
		return out, nil
	},
}

func dictView(self *exec.Value, va *exec.VarArgs, f func(*exec.Pair) any) (any, error) {
	if len(va.Args)+len(va.KwArgs) > 0 {
		return nil, errors.New("takes no arguments")
	}
	pairs, _ := dictPairs(self)
	out := make(pyList, len(pairs))
	for i, p := range pairs {
		out[i] = f(p)
	}
	return out, nil
}
