package chat

import (
	"fmt"
	"strings"

	"github.com/nikolalohinski/gonja/v2/builtins"
	"github.com/nikolalohinski/gonja/v2/exec"
)

// The filters, tests and methods a template may use, each wrapped to count
// a step and to charge, before it runs, the most it can build from what it
// is given (bound). gonja's own builtins are used where they behave; those
// that build text by a count they are given without limit (wordwrap,
// pprint, urlize) are left out, and so are the list and dict methods that
// mutate, which transformers' ImmutableSandboxedEnvironment refuses too.

// bound is the most bytes a filter or method builds from its input and
// arguments.
type bound func(in *exec.Value, va *exec.VarArgs) int

func scalar(*exec.Value, *exec.VarArgs) int   { return 64 }
func existing(*exec.Value, *exec.VarArgs) int { return 0 } // returns a part of its input

// scaled builds up to k bytes per byte of its input (case mapping, escaping).
func scaled(k int) bound {
	return func(in *exec.Value, va *exec.VarArgs) int { return k*size(in) + argsSize(va) + 64 }
}

// perItem builds a list of the input's items (or characters).
func perItem(in *exec.Value, va *exec.VarArgs) int { return 64*items(in) + argsSize(va) + 64 }

func size(v *exec.Value) int {
	n, _ := weigh(v, 1<<50, false)
	return n
}

func argsSize(va *exec.VarArgs) int {
	n := 0
	for _, a := range va.Args {
		n += size(a)
	}
	for _, a := range va.KwArgs {
		n += size(a)
	}
	return n
}

// arg is a call's argument by position or keyword, nil when not given.
func arg(va *exec.VarArgs, i int, name string) *exec.Value {
	if i < len(va.Args) {
		return va.Args[i]
	}
	return va.KwArgs[name]
}

// intArg is an integer argument (0 when absent, negative or not an
// integer: the call fails or builds nothing for those).
func intArg(va *exec.VarArgs, i int, name string, def int) int {
	a := arg(va, i, name)
	if a == nil || !a.IsInteger() {
		return def
	}
	return max(a.Integer(), 0)
}

func strArg(va *exec.VarArgs, i int, name string) string {
	if a := arg(va, i, name); a != nil {
		return a.String()
	}
	return ""
}

// mulSize is a*b bytes, saturating instead of wrapping.
func mulSize(a, b int) int {
	if a != 0 && b > (1<<50)/a {
		return 1 << 50
	}
	return a * b
}

// replaced bounds s.replace(old, new).
func replaced(s, old, new string) int {
	n := strings.Count(s, old) // len+1 for an empty old
	return len(s) + mulSize(n, len(new))
}

// maxNumber is the largest number written in a format string: a field's
// width or precision.
func maxNumber(f string) int {
	most, n := 0, 0
	for i := 0; i <= len(f); i++ {
		if i < len(f) && f[i] >= '0' && f[i] <= '9' {
			n = min(n*10+int(f[i]-'0'), 1<<40)
			continue
		}
		most, n = max(most, n), 0
	}
	return most
}

// formatted bounds a format string with fields opened by open ('%' for
// Go's fmt, '{' for Python's str.format) filled from va.
func formatted(f string, open string, va *exec.VarArgs) int {
	most := 0
	for _, a := range va.Args {
		most = max(most, size(a))
	}
	for _, a := range va.KwArgs {
		most = max(most, size(a))
	}
	fields := strings.Count(f, open)
	return len(f) + mulSize(fields, 4*most+4*maxNumber(f)+64)
}

var filterBounds = map[string]bound{
	"abs": scalar, "float": scalar, "int": scalar, "round": scalar, "length": scalar, "count": scalar,
	"wordcount": scalar, "sum": scalar, "filesizeformat": scalar,
	"attr": existing, "default": existing, "d": existing, "first": existing, "last": existing,
	"max": existing, "min": existing, "random": existing,
	"tojson": existing, // bounded as it prints (filterToJSON)
	"safe":   scaled(1), "string": scaled(1), "striptags": scaled(1),
	"capitalize": scaled(3), "lower": scaled(3), "upper": scaled(3), "title": scaled(3), "trim": scaled(1),
	"escape": scaled(6), "e": scaled(6), "forceescape": scaled(6), "urlencode": scaled(3), "xmlattr": scaled(8),
	"list": perItem, "unique": perItem, "sort": perItem, "dictsort": perItem, "items": perItem, "map": perItem,
	"select": perItem, "reject": perItem, "selectattr": perItem, "rejectattr": perItem, "groupby": perItem,
	"reverse":  perItem,
	"truncate": func(in *exec.Value, va *exec.VarArgs) int { return size(in) + len(strArg(va, 2, "end")) + 64 },
	"center":   func(in *exec.Value, va *exec.VarArgs) int { return size(in) + intArg(va, 0, "width", 0) },
	"batch": func(in *exec.Value, va *exec.VarArgs) int {
		return 64*items(in) + mulSize(16, intArg(va, 0, "linecount", 0)) + 64
	},
	"slice": func(in *exec.Value, va *exec.VarArgs) int {
		return 64*items(in) + mulSize(64, intArg(va, 0, "slices", 0)) + 64
	},
	"indent": func(in *exec.Value, va *exec.VarArgs) int {
		width := 4
		if a := arg(va, 0, "width"); a != nil {
			width = len(a.String())
			if a.IsInteger() {
				width = max(a.Integer(), 0)
			}
		}
		s := in.String()
		return len(s) + mulSize(strings.Count(s, "\n")+1, width)
	},
	"join": func(in *exec.Value, va *exec.VarArgs) int {
		return size(in) + mulSize(items(in), len(strArg(va, 0, "d"))) + 64
	},
	"replace": func(in *exec.Value, va *exec.VarArgs) int {
		return replaced(in.String(), strArg(va, 0, "old"), strArg(va, 1, "new"))
	},
	"format": func(in *exec.Value, va *exec.VarArgs) int { return formatted(in.String(), "%", va) },
}

// filterSet is every filter a template may use, guarded.
var filterSet = func() *exec.FilterSet {
	set := map[string]exec.FilterFunction{}
	for name, bound := range filterBounds {
		f, ok := filters[name]
		if !ok {
			if f, ok = builtins.Filters.Get(name); !ok {
				panic("gonja has no filter " + name)
			}
		}
		set[name] = guardFilter(name, f, bound)
	}
	return exec.NewFilterSet(set)
}()

// iterates are the filters that walk their input's items: gonja walks a
// dict by looking each key up again, in time quadratic in its size, so
// they are given its keys (what iterating a dict gives in Python).
var iterates = map[string]bool{
	"list": true, "map": true, "select": true, "reject": true, "selectattr": true, "rejectattr": true,
	"sort": true, "unique": true, "join": true, "first": true, "last": true, "sum": true, "max": true,
	"min": true, "batch": true, "groupby": true, "reverse": true, "random": true,
}

// dictKeys is a dict's keys as a list; any other value as it is.
func dictKeys(v *exec.Value) *exec.Value {
	pairs, ok := orderedPairs(v)
	if !ok {
		return v
	}
	keys := make(pyList, len(pairs))
	for i, p := range pairs {
		keys[i] = p.Key.Interface()
	}
	return exec.AsValue(keys)
}

func guardFilter(name string, f exec.FilterFunction, bound bound) exec.FilterFunction {
	return func(e *exec.Evaluator, in *exec.Value, va *exec.VarArgs) *exec.Value {
		b := budgetOf(e.Environment.Context)
		b.step(1)
		b.build(bound(in, va))
		if iterates[name] {
			in = dictKeys(in)
		}
		out := f(e, in, va)
		if !out.IsError() {
			b.weighs(out)
		}
		return out
	}
}

// gonjaTests are gonja's tests kept as they are.
var gonjaTests = []string{
	"callable", "divisibleby", "eq", "equalto", "==", "escaped", "even", "filter", "float", "ge", ">=",
	"gt", "greaterthan", ">", "in", "integer", "le", "<=", "lower", "lt", "lessthan", "<", "ne", "!=",
	"number", "odd", "sameas", "test", "upper",
}

// testSet is every test a template may use, each a step.
var testSet = func() *exec.TestSet {
	set := map[string]exec.TestFunction{}
	for _, name := range gonjaTests {
		t, ok := builtins.Tests.Get(name)
		if !ok {
			panic("gonja has no test " + name)
		}
		set[name] = guardTest(t)
	}
	for name, t := range tests {
		set[name] = guardTest(t)
	}
	return exec.NewTestSet(set)
}()

func guardTest(t exec.TestFunction) func(*exec.Evaluator, *exec.Value, *exec.VarArgs) (bool, error) {
	return func(e *exec.Evaluator, in *exec.Value, va *exec.VarArgs) (bool, error) {
		budgetOf(e.Environment.Context).step(1)
		switch t := t.(type) {
		case func(*exec.Evaluator, *exec.Value, *exec.VarArgs) (bool, error):
			return t(e, in, va)
		case func(*exec.Context, *exec.Value, *exec.VarArgs) (bool, error):
			return t(e.Environment.Context, in, va)
		}
		return false, fmt.Errorf("test of type %T", t)
	}
}

// method is a method a template may call and what it can build.
type method[I any] struct {
	fn    exec.Method[I]
	bound bound
}

// strMethodBounds bounds kiln's string methods (jinja.go) and those of
// gonja's that are kept.
var strMethodBounds = map[string]bound{
	// Parts of the string itself.
	"strip": existing, "lstrip": existing, "rstrip": existing, "removeprefix": existing,
	"removesuffix": existing, "partition": scalar, "rpartition": scalar,
	"split": splitBound, "rsplit": splitBound,
	"splitlines": func(in *exec.Value, va *exec.VarArgs) int {
		return 48 * (strings.Count(in.String(), "\n") + strings.Count(in.String(), "\r") + 1)
	},
	// Answers.
	"startswith": scalar, "endswith": scalar, "count": scalar, "find": scalar, "rfind": scalar,
	"isalnum": scalar, "isalpha": scalar, "isascii": scalar, "isdecimal": scalar, "isdigit": scalar,
	"islower": scalar, "isnumeric": scalar, "isprintable": scalar, "isspace": scalar, "istitle": scalar,
	"isupper": scalar,
	// New strings.
	"capitalize": scaled(3), "capwords": scaled(3), "casefold": scaled(3), "lower": scaled(3),
	"upper": scaled(3), "swapcase": scaled(3), "title": scaled(3), "encode": scaled(4),
	"center": padded, "ljust": padded, "rjust": padded, "zfill": padded,
	"expandtabs": func(in *exec.Value, va *exec.VarArgs) int {
		s := in.String()
		return len(s) + mulSize(strings.Count(s, "\t"), intArg(va, 0, "tabsize", 8))
	},
	"join": func(in *exec.Value, va *exec.VarArgs) int {
		a := arg(va, 0, "iterable")
		if a == nil {
			return 64
		}
		return size(a) + mulSize(items(a), len(in.String()))
	},
	"replace": func(in *exec.Value, va *exec.VarArgs) int {
		return replaced(in.String(), strArg(va, 0, "old"), strArg(va, 1, "new"))
	},
	"format":     func(in *exec.Value, va *exec.VarArgs) int { return formatted(in.String(), "{", va) },
	"format_map": func(in *exec.Value, va *exec.VarArgs) int { return formatted(in.String(), "{", va) },
}

// padded bounds center, ljust, rjust and zfill: the width in characters of
// up to 4 bytes.
func padded(in *exec.Value, va *exec.VarArgs) int {
	return len(in.String()) + mulSize(4, intArg(va, 0, "width", 0))
}

// splitBound bounds split and rsplit: a slot per part.
func splitBound(in *exec.Value, va *exec.VarArgs) int {
	s := in.String()
	parts := fieldCount(s) + 1
	if sep := arg(va, 0, "sep"); given(sep) && sep.String() != "" {
		parts = strings.Count(s, sep.String()) + 1
	}
	return 48 * parts
}

// fieldCount is len(strings.Fields(s)), without building them.
func fieldCount(s string) int {
	n, in := 0, false
	for _, r := range s {
		space := pyIsSpace(r)
		if !space && !in {
			n++
		}
		in = !space
	}
	return n
}

// dictMethodBounds: kiln's mapping methods (jinja.go).
var dictMethodBounds = map[string]bound{"items": perItem, "keys": perItem, "values": perItem, "get": existing, "copy": perItem}

var (
	strMethodTable   = methodTable(strMethods, builtins.Methods.Str, strMethodBounds)
	dictMethodTable  = methodTable(dictMethods, builtins.Methods.Dict, dictMethodBounds)
	listMethodTable  = methodTable(listMethods, builtins.Methods.List, map[string]bound{"copy": perItem})
	intMethodTable   = methodTable(nil, builtins.Methods.Int, allScalar("is_integer", "bit_length", "bit_count", "as_integer_ratio"))
	floatMethodTable = methodTable(nil, builtins.Methods.Float, allScalar("is_integer", "as_integer_ratio", "hex"))
	boolMethodTable  = methodTable(nil, builtins.Methods.Bool, allScalar("string", "int", "bit_length", "bit_count", "as_integer_ratio"))
)

func allScalar(names ...string) map[string]bound {
	m := map[string]bound{}
	for _, n := range names {
		m[n] = scalar
	}
	return m
}

// methodTable joins each bounded method with its function: kiln's own, else
// gonja's.
func methodTable[I any](own map[string]exec.Method[I], builtin *exec.MethodSet[I], bounds map[string]bound) map[string]method[I] {
	out := map[string]method[I]{}
	for name, b := range bounds {
		fn, ok := own[name]
		if !ok {
			if fn, ok = builtin.Get(name); !ok {
				panic("gonja has no method " + name)
			}
		}
		out[name] = method[I]{fn, b}
	}
	return out
}

// noMethods is gonja's method sets, empty: every method call is rewritten
// to kiln's hook (hooks.go), which also spares gonja's dispatch its deep
// copy of the object.
var noMethods = exec.Methods{
	Bool:  exec.NewMethodSet(map[string]exec.Method[bool]{}),
	Int:   exec.NewMethodSet(map[string]exec.Method[int]{}),
	Float: exec.NewMethodSet(map[string]exec.Method[float64]{}),
	Str:   exec.NewMethodSet(map[string]exec.Method[string]{}),
	Dict:  exec.NewMethodSet(map[string]exec.Method[map[string]any]{}),
	List:  exec.NewMethodSet(map[string]exec.Method[[]any]{}),
}

// bind is x's method name from table, charged to b; nil when there is none.
func bind[I any](b *budget, table map[string]method[I], name string, self I, x *exec.Value) func(*exec.VarArgs) (any, error) {
	m, ok := table[name]
	if !ok {
		return nil
	}
	return func(va *exec.VarArgs) (any, error) {
		b.step(1)
		b.build(m.bound(x, va))
		out, err := m.fn(self, x, va)
		if err == nil {
			b.weighs(out)
		}
		return out, err
	}
}
