package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// Templates are written against Python data: dicts that keep insertion
// order, lists that index from the end, None distinct from undefined. This
// file maps JSON onto gonja values with those properties and prints them back
// the way Python's json.dumps does.

// pyNone is Python's None. Templates see a typed nil pointer: gonja treats
// it as nil everywhere (falsy, prints nothing), while the tests `none`,
// `defined` and the `default` filter can tell it from a missing value.
type pyNone struct{}

var none = (*pyNone)(nil)

func isNone(v *exec.Value) bool {
	return v.Val.IsValid() && v.Val.Type() == reflect.TypeOf(none)
}

// isUndefined reports a value the template looked up and did not find.
func isUndefined(v *exec.Value) bool {
	return !isNone(v) && v.IsNil()
}

// pyList is a Python list: unlike gonja's slices it supports every negative
// index (gonja's lookup misses x[-1] on a one-element list).
type pyList []any

// GetItem implements exec.ItemGetter.
func (l pyList) GetItem(key any) (*exec.Value, bool) {
	i, ok := key.(int)
	if !ok {
		return exec.AsValue(nil), false
	}
	if i < 0 {
		i += len(l)
	}
	if i < 0 || i >= len(l) {
		return exec.AsValue(nil), false
	}
	return exec.ToValue(l[i]), true
}

// decodeJSON parses JSON text into template values: objects become ordered
// *exec.Dict (an empty one an empty map), arrays pyList, integers int, other
// numbers float64, null none.
func decodeJSON(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeValue(dec)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("unexpected data after the JSON value")
	}
	return v, nil
}

func decodeValue(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			d := exec.NewDict()
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				v, err := decodeValue(dec)
				if err != nil {
					return nil, err
				}
				setKey(d, kt.(string), v)
			}
			_, err := dec.Token()
			if len(d.Pairs) == 0 {
				// gonja holds every Dict true; an empty Go map is false,
				// like Python's {} (and has no order to keep).
				return map[string]any{}, err
			}
			return d, err
		case '[':
			l := pyList{}
			for dec.More() {
				v, err := decodeValue(dec)
				if err != nil {
					return nil, err
				}
				l = append(l, v)
			}
			_, err := dec.Token()
			return l, err
		}
		return nil, fmt.Errorf("unexpected %v", t)
	case json.Number:
		return pyNumber(string(t))
	case nil:
		return none, nil
	default: // string, bool
		return t, nil
	}
}

// setKey sets key like a Python dict assignment: a repeated key keeps its
// first position and takes the last value (what json.loads does).
func setKey(d *exec.Dict, key string, v any) {
	for _, p := range d.Pairs {
		if p.Key.String() == key {
			p.Value = exec.ToValue(v)
			return
		}
	}
	d.Pairs = append(d.Pairs, &exec.Pair{Key: exec.AsValue(key), Value: exec.ToValue(v)})
}

// bigInt is an integer beyond int64: Python keeps it exact, so it is kept as
// written and printed back as is (templates do no arithmetic on such).
type bigInt struct{ lit string }

func (b bigInt) String() string { return b.lit }

func pyNumber(lit string) (any, error) {
	if !strings.ContainsAny(lit, ".eE") {
		i, err := strconv.ParseInt(lit, 10, 64)
		if err == nil {
			return int(i), nil
		}
		if isRangeErr(err) {
			return bigInt{lit}, nil
		}
		return nil, err
	}
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil && !isRangeErr(err) {
		return nil, err
	}
	return f, nil
}

func isRangeErr(err error) bool {
	ne, ok := err.(*strconv.NumError)
	return ok && ne.Err == strconv.ErrRange
}

// dumpOptions are json.dumps' arguments that templates use.
type dumpOptions struct {
	ensureASCII bool
	indent      string // "" with hasIndent false: one line
	hasIndent   bool
	itemSep     string
	keySep      string
	sortKeys    bool
	limit       int // bytes of output, past which dumping fails with errTooBig
}

func newDumpOptions() dumpOptions {
	return dumpOptions{itemSep: ", ", keySep: ": ", limit: math.MaxInt}
}

// errTooBig is a dump over its dumpOptions.limit.
var errTooBig = errors.New("output over its limit")

// pyDumps prints v as Python's json.dumps(v, ...) would.
func pyDumps(v *exec.Value, o dumpOptions) (string, error) {
	var b strings.Builder
	if err := dumpValue(&b, v, o, 0); err != nil {
		return "", err
	}
	return b.String(), nil
}

func dumpValue(b *strings.Builder, v *exec.Value, o dumpOptions, depth int) error {
	if depth > maxValueDepth {
		return fmt.Errorf("tojson: value nested too deeply")
	}
	if b.Len() > o.limit {
		return errTooBig
	}
	if v.IsNil() {
		b.WriteString("null")
		return nil
	}
	switch x := v.Interface().(type) {
	case bigInt:
		b.WriteString(x.lit)
		return nil
	case *exec.Dict:
		return dumpPairs(b, x.Pairs, o, depth)
	case exec.Dict:
		return dumpPairs(b, x.Pairs, o, depth)
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		pairs := make([]*exec.Pair, len(keys))
		for i, k := range keys {
			pairs[i] = &exec.Pair{Key: exec.AsValue(k), Value: exec.ToValue(x[k])}
		}
		return dumpPairs(b, pairs, o, depth)
	}
	switch {
	case v.IsBool():
		if v.Bool() {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case v.IsInteger():
		b.WriteString(strconv.Itoa(v.Integer()))
	case v.IsFloat():
		b.WriteString(pyFloatJSON(v.Float()))
	case v.IsString():
		writeJSONString(b, v.String(), o.ensureASCII)
	case v.IsList():
		n := v.Len()
		if n == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i := 0; i < n; i++ {
			if i > 0 {
				b.WriteString(o.itemSep)
			}
			if err := newline(b, o, depth+1); err != nil {
				return err
			}
			if err := dumpValue(b, v.Index(i), o, depth+1); err != nil {
				return err
			}
		}
		if err := newline(b, o, depth); err != nil {
			return err
		}
		b.WriteByte(']')
	default:
		return fmt.Errorf("Object of type %s is not JSON serializable", v.Val.Type())
	}
	return nil
}

func dumpPairs(b *strings.Builder, pairs []*exec.Pair, o dumpOptions, depth int) error {
	if len(pairs) == 0 {
		b.WriteString("{}")
		return nil
	}
	if o.sortKeys {
		pairs = append([]*exec.Pair(nil), pairs...)
		sort.SliceStable(pairs, func(i, j int) bool { return pairs[i].Key.String() < pairs[j].Key.String() })
	}
	b.WriteByte('{')
	for i, p := range pairs {
		if i > 0 {
			b.WriteString(o.itemSep)
		}
		if err := newline(b, o, depth+1); err != nil {
			return err
		}
		if !p.Key.IsString() {
			return fmt.Errorf("keys must be str, not %s", p.Key.Val.Type())
		}
		writeJSONString(b, p.Key.String(), o.ensureASCII)
		b.WriteString(o.keySep)
		if err := dumpValue(b, p.Value, o, depth+1); err != nil {
			return err
		}
	}
	if err := newline(b, o, depth); err != nil {
		return err
	}
	b.WriteByte('}')
	return nil
}

func newline(b *strings.Builder, o dumpOptions, depth int) error {
	if !o.hasIndent {
		return nil
	}
	if b.Len()+depth*len(o.indent) > o.limit {
		return errTooBig
	}
	b.WriteByte('\n')
	for range depth {
		b.WriteString(o.indent)
	}
	return nil
}

const hexDigits = "0123456789abcdef"

func writeJSONString(b *strings.Builder, s string, ensureASCII bool) {
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			switch {
			case r < 0x20 || (ensureASCII && r > 0x7e && r <= 0xffff):
				writeU(b, r)
			case ensureASCII && r > 0xffff:
				r -= 0x10000
				writeU(b, 0xd800+(r>>10))
				writeU(b, 0xdc00+(r&0x3ff))
			default:
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}

func writeU(b *strings.Builder, r rune) {
	b.WriteString(`\u`)
	for shift := 12; shift >= 0; shift -= 4 {
		b.WriteByte(hexDigits[(r>>shift)&0xf])
	}
}

// pyFloatJSON is float.__repr__ as json.dumps prints it.
func pyFloatJSON(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	return pyFloatRepr(f)
}

// pyFloatRepr is Python's repr(float): the shortest round-tripping digits,
// positional for exponents in [-4, 16), else scientific with a two-digit
// (at least) exponent.
func pyFloatRepr(f float64) string {
	switch {
	case math.IsNaN(f):
		return "nan"
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	}
	sci := strconv.FormatFloat(f, 'e', -1, 64) // d.ddde±XX
	mant, expStr, _ := strings.Cut(sci, "e")
	exp, _ := strconv.Atoi(expStr)
	sign := ""
	if strings.HasPrefix(mant, "-") {
		sign, mant = "-", mant[1:]
	}
	digits := strings.Replace(mant, ".", "", 1)
	if exp < -4 || exp >= 16 {
		m := digits[:1]
		if len(digits) > 1 {
			m += "." + digits[1:]
		}
		es := "+"
		if exp < 0 {
			es, exp = "-", -exp
		}
		return fmt.Sprintf("%s%se%s%02d", sign, m, es, exp)
	}
	var s string
	switch point := exp + 1; {
	case point <= 0:
		s = "0." + strings.Repeat("0", -point) + digits
	case point >= len(digits):
		s = digits + strings.Repeat("0", point-len(digits)) + ".0"
	default:
		s = digits[:point] + "." + digits[point:]
	}
	return sign + s
}

// pyStr is Python's str(v) for the values templates concatenate or print.
func pyStr(v *exec.Value) string {
	switch {
	case isNone(v):
		return "None"
	case v.IsFloat():
		return pyFloatRepr(v.Float())
	case v.IsBool():
		if v.Bool() {
			return "True"
		}
		return "False"
	}
	return v.String()
}
