package chat

import (
	"reflect"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// pyNamespace is what namespace() makes. Its own type keeps it out of
// lists, dicts and other namespaces (see weigh), so no value can contain
// itself. It has no methods: gonja would offer them as attributes.
type pyNamespace map[string]any

// maxValueDepth bounds the nesting of the values a template works on, as
// tojson does.
const maxValueDepth = 500

// weigh returns the size of v as a template could print or copy it: its
// strings' bytes and 16 for every value, lists and dicts included; it stops
// counting past limit. Shared parts count each time they are reached, so a
// list built by doubling weighs what printing it would cost. code reports
// a value that is not data (a macro, a loop, a namespace); with strict it
// stops there.
func weigh(v any, limit int, strict bool) (n int, code bool) {
	w := weigher{limit: limit, strict: strict}
	w.add(v, 0)
	return w.n, w.code
}

type weigher struct {
	n, limit int
	strict   bool
	code     bool
}

func (w *weigher) add(v any, depth int) {
	if w.n > w.limit || (w.code && w.strict) {
		return
	}
	if depth > maxValueDepth {
		w.n = w.limit + 1
		return
	}
	if x, ok := v.(*exec.Value); ok {
		if x == nil || !x.Val.IsValid() {
			w.n += 16
			return
		}
		v = x.Interface()
	}
	w.n += 16
	switch x := v.(type) {
	case nil, bool, int, int64, float64, *pyNone, bigInt:
	case string:
		w.n += len(x)
	case []byte:
		w.n += len(x)
	case pyList:
		for _, e := range x {
			w.add(e, depth+1)
		}
	case []any:
		for _, e := range x {
			w.add(e, depth+1)
		}
	case exec.ValuesList:
		for _, e := range x {
			w.add(e, depth+1)
		}
	case []string:
		for _, s := range x {
			w.n += 16 + len(s)
		}
	case *exec.Dict:
		w.pairs(x.Pairs, depth)
	case exec.Dict:
		w.pairs(x.Pairs, depth)
	case map[string]any:
		for k, e := range x {
			w.n += 16 + len(k)
			w.add(e, depth+1)
		}
	case pyNamespace:
		w.code = true
		for k, e := range x {
			w.n += 16 + len(k)
			w.add(e, depth+1)
		}
	default:
		w.reflect(reflect.ValueOf(v), depth)
	}
}

func (w *weigher) pairs(pairs []*exec.Pair, depth int) {
	for _, p := range pairs {
		w.add(p.Key, depth+1)
		w.add(p.Value, depth+1)
	}
}

// reflect weighs the Go values gonja's filters return ([]int, [2]*Value,
// map[string]int ...); functions, channels and structs (a loop, a cycler)
// are code.
func (w *weigher) reflect(v reflect.Value, depth int) {
	switch v.Kind() {
	case reflect.String:
		w.n += v.Len()
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			w.add(v.Index(i).Interface(), depth+1)
		}
	case reflect.Map:
		for it := v.MapRange(); it.Next(); {
			w.add(it.Key().Interface(), depth+1)
			w.add(it.Value().Interface(), depth+1)
		}
	default:
		w.code = true
	}
}

// items is the number of items a loop over v takes (bytes for a string, an
// upper bound of its characters).
func items(v *exec.Value) int {
	switch {
	case v.IsString():
		return len(v.String())
	case v.IsList(), v.IsDict():
		return v.Len()
	}
	return 0
}
