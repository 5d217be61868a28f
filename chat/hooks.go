package chat

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/nikolalohinski/gonja/v2/builtins"
	"github.com/nikolalohinski/gonja/v2/exec"
)

// The hooks the rewritten tree calls (sandbox.go), and the functions a
// template reaches by name, bound to one rendering's budget.

// guarded is a template function (a macro, loop(), caller()) that counts a
// level of nesting for each call.
type guarded func(*exec.VarArgs) *exec.Value

// context returns the variables of one rendering: its hooks and the
// globals that build (range, namespace, dict).
func (b *budget) context(data map[string]any) *exec.Context {
	data[budgetKey] = b
	data[hookCall] = b.call
	data[hookIter] = b.iter
	data[hookAdd] = b.binary(b.add)
	data[hookMul] = b.binary(b.mul)
	data[hookCat] = b.binary(b.cat)
	data[hookList] = b.list
	data[hookDict] = b.dict
	data[hookStore] = b.store
	data[hookMethod] = b.method
	data["range"] = b.pyRange
	data["namespace"] = b.namespace
	data["dict"] = b.dictFunc
	return baseContext.Inherit().Update(exec.NewContext(data))
}

// baseContext is the globals that build nothing: transformers' extras and
// gonja's cycler, joiner and gettext. lipsum is left out (it builds text
// by the paragraph count it is given).
var baseContext = func() *exec.Context {
	g := map[string]any{}
	for _, name := range []string{"cycler", "joiner", "_", "gettext", "ngettext"} {
		g[name], _ = builtins.GlobalFunctions.Get(name)
	}
	for name, f := range globals {
		g[name] = f
	}
	return exec.NewContext(g)
}()

// args starts a hook: its first argument is the line it was written on.
func (b *budget) args(va *exec.VarArgs) []*exec.Value {
	b.line = va.Args[0].Integer()
	b.step(1)
	return va.Args[1:]
}

// raise ends the rendering with a template error (where Python would raise
// a TypeError).
func (b *budget) raise(format string, a ...any) {
	panic(&abort{fmt.Errorf("chat template: line %d: %s", b.line, fmt.Sprintf(format, a...))})
}

// call is \x00call(f, name): f itself, guarded when it runs template code.
func (b *budget) call(va *exec.VarArgs) *exec.Value {
	args := b.args(va)
	f, name := args[0], args[1].String()
	if f.IsError() {
		return f
	}
	if !f.IsCallable() {
		if f.IsNil() && !isNone(f) {
			b.raise("'%s' is undefined", name)
		}
		b.raise("'%s' is not callable", name)
	}
	return b.callable(f)
}

// callable is f, guarded when it runs template code.
func (b *budget) callable(f *exec.Value) *exec.Value {
	switch fn := f.Interface().(type) {
	case func(*exec.VarArgs) *exec.Value: // loop(), caller(), a loop's cycle()
		return exec.AsValue(b.guard(func(va *exec.VarArgs) *exec.Value {
			if len(va.Args) > 0 {
				b.step(2 * items(va.Args[0])) // loop(items) walks them as a for loop does
			}
			return fn(va)
		}, false))
	case exec.Macro: // not left guarded by its definition (none should be)
		return exec.AsValue(b.guard(fn, true))
	}
	return f
}

// method is \x00method(x, name), for x.name(...): x's attribute when it is
// callable (a macro passed in **kwargs, loop.cycle), else x's method, as
// gonja resolves them.
func (b *budget) method(va *exec.VarArgs) *exec.Value {
	args := b.args(va)
	x, name := args[0], args[1].String()
	if x.IsError() {
		return x
	}
	if !x.IsNil() {
		attr, found := x.GetAttribute(name)
		if !found {
			attr, found = x.GetItem(name)
		}
		if found && attr.IsCallable() {
			return b.callable(attr)
		}
	}
	var fn func(*exec.VarArgs) (any, error)
	switch {
	case x.IsString():
		fn = bind(b, strMethodTable, name, x.String(), x)
	case x.IsBool():
		fn = bind(b, boolMethodTable, name, x.Bool(), x)
	case x.IsFloat():
		fn = bind(b, floatMethodTable, name, x.Float(), x)
	case x.IsInteger():
		fn = bind(b, intMethodTable, name, x.Integer(), x)
	case x.IsDict():
		fn = bind(b, dictMethodTable, name, nil, x)
	case x.IsList():
		fn = bind(b, listMethodTable, name, nil, x)
	}
	if fn == nil {
		b.raise("'%s' object has no attribute '%s'", pyType(x), name)
	}
	return exec.AsValue(func(va *exec.VarArgs) *exec.Value {
		out, err := fn(va)
		if err != nil {
			b.raise("%s(): %v", name, err)
		}
		return exec.ToValue(out)
	})
}

// pyType is the Python name of v's type, for messages.
func pyType(v *exec.Value) string {
	switch {
	case isNone(v), v.IsNil():
		return "NoneType"
	case v.IsString():
		return "str"
	case v.IsBool():
		return "bool"
	case v.IsInteger():
		return "int"
	case v.IsFloat():
		return "float"
	case v.IsList():
		return "list"
	case v.IsDict():
		return "dict"
	}
	return v.Val.Kind().String()
}

// guard makes fn count a level of nesting per call. A macro that gathers
// its arguments into *args or **kwargs makes new values of them, weighed
// as a list literal is.
func (b *budget) guard(fn func(*exec.VarArgs) *exec.Value, gathers bool) guarded {
	return func(va *exec.VarArgs) *exec.Value {
		b.enter()
		defer b.leave()
		if !gathers {
			return fn(va)
		}
		n := 0
		for _, a := range va.Args {
			w, _ := weigh(a, b.lim.Output, false)
			n += w
		}
		for _, a := range va.KwArgs {
			w, _ := weigh(a, b.lim.Output, false)
			n += w
		}
		if n > b.lim.Output {
			b.fail("a call's arguments weigh more than %d bytes", b.lim.Output)
		}
		return fn(va)
	}
}

// iter is \x00iter(x): a for loop's items, counted before the loop runs.
func (b *budget) iter(va *exec.VarArgs) *exec.Value {
	args := b.args(va)
	x, pairs := args[0], args[1].Bool()
	b.step(2 * items(x))
	// gonja walks a dict by looking each key up again: give it the keys,
	// or (key, value) pairs to a loop of two names, as gonja gives them.
	dict, ok := orderedPairs(x)
	if !ok {
		return x
	}
	if !pairs {
		return dictKeys(x)
	}
	out := make(pyList, len(dict))
	for i, p := range dict {
		out[i] = pyList{p.Key.Interface(), p.Value.Interface()}
	}
	return exec.AsValue(out)
}

// weighs fails when v is over Limits.Output as it would print.
func (b *budget) weighs(v any) {
	if n, _ := weigh(v, b.lim.Output, false); n > b.lim.Output {
		b.fail("a value of more than %d bytes (or nested more than %d deep)", b.lim.Output, maxValueDepth)
	}
}

// data fails unless v is data of at most Limits.Output: what a list, a
// dict or a namespace may hold.
func (b *budget) data(v any, what string) {
	n, code := weigh(v, b.lim.Output, true)
	if code {
		b.fail("%s may hold only data, not a macro, a loop or a namespace", what)
	}
	if n > b.lim.Output {
		b.fail("%s of more than %d bytes (or nested more than %d deep)", what, b.lim.Output, maxValueDepth)
	}
}

// list is \x00list(items...): a list or tuple literal.
func (b *budget) list(va *exec.VarArgs) *exec.Value {
	args := b.args(va)
	b.build(24 + 16*len(args))
	l := make(pyList, len(args))
	for i, a := range args {
		l[i] = a.Interface()
	}
	b.data(l, "a list")
	return exec.AsValue(l)
}

// dict is \x00dict(key, value, ...): a dict literal, in order; a repeated
// key keeps its first place and takes its last value, as in Python.
func (b *budget) dict(va *exec.VarArgs) *exec.Value {
	args := b.args(va)
	b.build(32 * len(args))
	if len(args) == 0 {
		return exec.AsValue(map[string]any{}) // false, like Python's {}
	}
	d := exec.NewDict()
	for i := 0; i+1 < len(args); i += 2 {
		k, v := args[i], args[i+1]
		at := slices.IndexFunc(d.Pairs, func(p *exec.Pair) bool { return p.Key.EqualValueTo(k) })
		if at >= 0 {
			d.Pairs[at].Value = v
		} else {
			d.Pairs = append(d.Pairs, &exec.Pair{Key: k, Value: v})
		}
	}
	b.data(d, "a dict")
	return exec.AsValue(d)
}

// store is \x00store(x): a value assigned to a namespace attribute.
func (b *budget) store(va *exec.VarArgs) *exec.Value {
	v := b.args(va)[0]
	b.data(v, "a namespace")
	return v
}

// binary adapts an operator to a hook of two arguments.
func (b *budget) binary(op func(l, r *exec.Value) *exec.Value) func(*exec.VarArgs) *exec.Value {
	return func(va *exec.VarArgs) *exec.Value {
		args := b.args(va)
		l, r := args[0], args[1]
		if l.IsError() {
			return l
		}
		if r.IsError() {
			return r
		}
		return op(l, r)
	}
}

// add is gonja's +, its strings and lists weighed before they are built.
func (b *budget) add(l, r *exec.Value) *exec.Value {
	switch {
	case l.IsList():
		if !r.IsList() {
			b.raise("can only concatenate list (not \"%s\") to list", pyType(r))
		}
		return b.concatLists(l, r)
	case l.IsFloat() || r.IsFloat():
		return exec.AsValue(l.Float() + r.Float())
	case l.IsString() || r.IsString():
		return exec.AsValue(b.concat(l.String(), r.String()))
	}
	return exec.AsValue(l.Integer() + r.Integer())
}

// cat is Jinja's ~: both sides as str().
func (b *budget) cat(l, r *exec.Value) *exec.Value {
	return exec.AsValue(b.concat(pyStr(l), pyStr(r)))
}

func (b *budget) concat(l, r string) string {
	b.build(len(l) + len(r))
	return l + r
}

// mul is Python's *: a string or list times an integer repeats it.
func (b *budget) mul(l, r *exec.Value) *exec.Value {
	if r.IsString() || r.IsList() {
		l, r = r, l
	}
	switch {
	case (l.IsString() || l.IsList()) && !r.IsInteger():
		b.raise("can't multiply sequence by non-int of type '%s'", pyType(r))
	case l.IsString():
		s, n := l.String(), max(r.Integer(), 0)
		if n > 0 && len(s) > b.lim.Output/n {
			b.fail("a string repeated %d times would be %d bytes, over the limit of %d", n, mulSize(len(s), n), b.lim.Output)
		}
		b.build(len(s) * n)
		return exec.AsValue(strings.Repeat(s, n))
	case l.IsList():
		n := max(r.Integer(), 0)
		w, _ := weigh(l, b.lim.Output, false)
		if n > 0 && w > b.lim.Output/n {
			b.fail("a list repeated %d times would be %d bytes, over the limit of %d", n, mulSize(w, n), b.lim.Output)
		}
		b.build(16 * l.Len() * n)
		out := make(pyList, 0, l.Len()*n)
		for range n {
			for i := range l.Len() {
				out = append(out, l.Index(i).Interface())
			}
		}
		return exec.AsValue(out)
	case l.IsFloat() || r.IsFloat():
		return exec.AsValue(l.Float() * r.Float())
	}
	return exec.AsValue(l.Integer() * r.Integer())
}

func (b *budget) concatLists(l, r *exec.Value) *exec.Value {
	n := l.Len() + r.Len()
	b.build(24 + 16*n)
	out := make(pyList, 0, n)
	for _, v := range []*exec.Value{l, r} {
		for i := range v.Len() {
			out = append(out, v.Index(i).Interface())
		}
	}
	b.weighs(out)
	return exec.AsValue(out)
}

// pyRange is Python's range(), of at most Limits.Range items (Jinja's
// sandbox's MAX_RANGE); it returns a list.
func (b *budget) pyRange(va *exec.VarArgs) *exec.Value {
	b.step(1)
	if len(va.KwArgs) > 0 {
		b.raise("range() takes no keyword arguments")
	}
	var a []int
	for _, v := range va.Args {
		if !v.IsInteger() {
			b.raise("range(): '%s' object cannot be interpreted as an integer", pyType(v))
		}
		a = append(a, v.Integer())
	}
	start, stop, step := 0, 0, 1
	switch len(a) {
	case 1:
		stop = a[0]
	case 2:
		start, stop = a[0], a[1]
	case 3:
		start, stop, step = a[0], a[1], a[2]
	default:
		b.raise("range expected 1 to 3 arguments, got %d", len(a))
	}
	if step == 0 {
		b.raise("range() arg 3 must not be zero")
	}
	// Counted in floats first: stop - start may not fit an int.
	n := math.Ceil((float64(stop) - float64(start)) / float64(step))
	if n > float64(b.lim.Range) {
		b.fail("range() of %.0f items is over the limit of %d", n, b.lim.Range)
	}
	b.build(16 * max(int(n), 0))
	out := make(pyList, max(int(n), 0))
	for k := range out {
		out[k] = start + k*step
	}
	return exec.AsValue(out)
}

// namespace is Jinja's namespace(**kwargs).
func (b *budget) namespace(va *exec.VarArgs) *exec.Value {
	b.step(1)
	ns := pyNamespace{}
	for k, v := range va.KwArgs {
		ns[k] = v.Interface()
	}
	b.data(map[string]any(ns), "a namespace")
	return exec.AsValue(ns)
}

// dictFunc is dict(**kwargs), keys in sorted order (gonja's VarArgs keep
// no order, and a prompt must not change from one rendering to the next).
func (b *budget) dictFunc(va *exec.VarArgs) *exec.Value {
	b.step(1)
	d := exec.NewDict()
	for _, k := range slices.Sorted(maps.Keys(va.KwArgs)) {
		d.Pairs = append(d.Pairs, &exec.Pair{Key: exec.AsValue(k), Value: va.KwArgs[k]})
	}
	b.data(d, "a dict")
	if len(d.Pairs) == 0 {
		return exec.AsValue(map[string]any{})
	}
	return exec.AsValue(d)
}
