package chat

import (
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"unsafe"

	controlStructures "github.com/nikolalohinski/gonja/v2/builtins/control_structures"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/nodes"
	"github.com/nikolalohinski/gonja/v2/parser"
	"github.com/nikolalohinski/gonja/v2/tokens"
)

// gonja has no hooks for bounding a rendering: its evaluator walks the
// tree with Go recursion and builds whatever the template asks for. So the
// parsed tree is rewritten once, at parse time, to pass every point where
// a template can loop, recurse or build through kiln's functions, which
// charge the rendering's budget (budget.go):
//
//   - every statement ({% %}) runs inside a kiln node that counts a step
//     and a level of nesting, and every piece of text and value printed
//     ({{ }}) inside one that counts a step and the bytes it writes (into
//     the prompt, or into a macro's or a block's output);
//   - every call goes through \x00call (or \x00method for x.m()), which
//     makes macros, loop() and caller() count a level each, and runs
//     kiln's bounded methods;
//   - a for loop's items are counted before it starts (\x00iter);
//   - +, * and ~ and list and dict literals are kiln's (\x00add ...), which
//     weigh what they would build before building it;
//   - every filter, test and method is kiln's wrapper around gonja's (or
//     kiln's own), which first bounds what the call can build;
//   - a loop over a dict, and a filter walking one, get its keys (gonja
//     would look each up again, in time quadratic in the dict's size);
//   - a namespace attribute may hold only data (\x00store), so no value
//     can contain itself.
//
// Hook names start with a NUL byte, which no template can spell. What is
// left to gonja between two hooks is bounded by the size of the values it
// works on, and every value is bounded by Limits.Output. Statements that
// reach other templates (include, import, extends, block) are refused: a
// chat template is one file, and transformers' environment has no loader.

const (
	budgetKey  = "\x00budget"
	hookCall   = "\x00call"
	hookIter   = "\x00iter"
	hookAdd    = "\x00add"
	hookMul    = "\x00mul"
	hookCat    = "\x00cat"
	hookList   = "\x00list"
	hookDict   = "\x00dict"
	hookStore  = "\x00store"
	hookMethod = "\x00method"
)

// Source limits: gonja's parser recurses once per bracket or prefix
// operator, and its renderer once per tree level, so these keep a hostile
// source from overflowing the stack at load time.
const (
	maxTagCode = 4096 // bytes of a tag outside its string literals
	maxNesting = 100  // brackets in a tag, blocks in the template
	maxTree    = 400  // levels of the parsed tree
)

// controlStructureSet is gonja's statements, less those that reach other
// templates.
var controlStructureSet = func() *exec.ControlStructureSet {
	set := map[string]parser.ControlStructureParser{}
	for _, name := range []string{"autoescape", "filter", "for", "if", "macro", "raw", "set", "with", "do", "break", "continue", "call"} {
		set[name], _ = controlStructures.All.Get(name)
	}
	for _, name := range []string{"include", "import", "from", "extends", "block", "trans"} {
		set[name] = func(p *parser.Parser, args *parser.Parser) (nodes.ControlStructure, error) {
			return nil, p.Error(fmt.Sprintf("{%% %s %%} is not supported: a chat template is one file", name), p.Current())
		}
	}
	return exec.NewControlStructureSet(set)
}()

// checkSource refuses a source gonja's parser would recurse on too deeply.
func checkSource(src string) error {
	blocks := 0
	for i := 0; ; {
		t, ok := nextTag(src, i)
		if !ok {
			return nil
		}
		i = t.end
		if t.kind == '#' {
			continue
		}
		code, depth := 0, 0
		for j := 0; j < len(t.body); j++ {
			switch c := t.body[j]; c {
			case '\'', '"':
				j = skipString(t.body, j)
			case '(', '[', '{':
				if depth++; depth > maxNesting {
					return fmt.Errorf("chat template: brackets nested more than %d deep (line %d)", maxNesting, lineOf(src, t.start))
				}
			case ')', ']', '}':
				depth--
			}
			code++
		}
		if code > maxTagCode {
			return fmt.Errorf("chat template: a tag of more than %d bytes (line %d)", maxTagCode, lineOf(src, t.start))
		}
		if t.kind != '%' {
			continue
		}
		f := strings.Fields(t.body)
		if len(f) == 0 {
			continue
		}
		switch {
		case strings.HasPrefix(f[0], "end"):
			blocks--
		case blockOpeners[f[0]] || (f[0] == "set" && topLevelAssign(t.body) < 0):
			if blocks++; blocks > maxNesting {
				return fmt.Errorf("chat template: blocks nested more than %d deep (line %d)", maxNesting, lineOf(src, t.start))
			}
		}
		if f[0] == "raw" {
			if end := strings.Index(src[i:], "endraw"); end >= 0 {
				i += end
			}
		}
	}
}

var blockOpeners = map[string]bool{"for": true, "if": true, "macro": true, "call": true, "filter": true, "with": true, "autoescape": true, "raw": true}

func lineOf(src string, at int) int { return strings.Count(src[:at], "\n") + 1 }

// rewriter rewrites a parsed template as the comment at the top says.
type rewriter struct {
	seen  map[nodes.Node]nodes.Node // a node may be reached twice (a method call's parent)
	depth int
	err   error
}

func rewrite(root *nodes.Template) error {
	w := &rewriter{seen: map[nodes.Node]nodes.Node{}}
	w.nodes(root.Nodes)
	return w.err
}

func (w *rewriter) fail(format string, a ...any) {
	if w.err == nil {
		w.err = fmt.Errorf("chat template: "+format, a...)
	}
}

func (w *rewriter) nodes(list []nodes.Node) {
	for i, n := range list {
		list[i] = w.stmt(n)
	}
}

func (w *rewriter) wrapper(wr *nodes.Wrapper) {
	if wr != nil {
		w.nodes(wr.Nodes)
	}
}

func (w *rewriter) stmt(n nodes.Node) nodes.Node {
	switch n := n.(type) {
	case *nodes.Data:
		return &nodes.ControlStructureBlock{Location: n.Position(), Name: "text", ControlStructure: &textNode{s: dataText(n), pos: n.Position()}}
	case *nodes.Output:
		n.Expression, n.Condition, n.Alternative = w.expr(n.Expression), w.expr(n.Condition), w.expr(n.Alternative)
		return &nodes.ControlStructureBlock{Location: n.Start, Name: "output", ControlStructure: &outputNode{out: n, parts: concatParts(n)}}
	case *nodes.Comment:
	case *nodes.ControlStructureBlock:
		w.depth++
		if w.depth > maxTree {
			w.fail("blocks nested more than %d deep", maxTree)
		}
		n.ControlStructure = w.controlStructure(n.ControlStructure)
		w.depth--
	default:
		w.fail("unexpected %T in the parsed template", n)
	}
	return n
}

// dataText is what gonja's renderer writes for a piece of text: its
// trimming is fixed by the parse.
func dataText(n *nodes.Data) string {
	out := n.Data.Val
	if n.RemoveFirstLineReturn {
		out = strings.TrimPrefix(out, "\r\n")
		out = strings.TrimPrefix(out, "\n")
	}
	if n.Trim.Left {
		out = strings.TrimLeft(out, " \r\n\t")
	}
	if n.Trim.Right {
		out = strings.TrimRight(out, " \r\n\t")
	}
	if n.RemoveTrailingWhiteSpaceFromLastLine {
		if i := strings.LastIndexByte(out, '\n'); i >= 0 {
			out = out[:i+1] + strings.TrimRight(out[i+1:], " \n\t\r")
		} else {
			out = strings.TrimRight(out, " \n\t\r")
		}
	}
	return out
}

func (w *rewriter) controlStructure(cs nodes.ControlStructure) nodes.ControlStructure {
	switch c := cs.(type) {
	case *controlStructures.RawControlStructure:
		data := field(c, "data").Interface().(*nodes.Data)
		return &textNode{s: data.Data.Val, pos: data.Position()}
	case *controlStructures.ForControlStructure:
		w.fields(c)
		pairs := &nodes.Bool{Location: &tokens.Token{Val: "pairs"}, Val: c.Value != ""}
		c.ObjectEvaluator = hook(hookIter, c.Position(), c.ObjectEvaluator, pairs)
	case *controlStructures.SetControlStructure:
		w.fields(c)
		if _, ok := field(c, "target").Interface().(*nodes.GetAttribute); ok {
			for _, name := range []string{"expression", "alternative"} {
				if f := field(c, name); !f.IsNil() {
					f.Set(reflect.ValueOf(hook(hookStore, c.Position(), f.Interface().(nodes.Expression))))
				}
			}
		}
	case *controlStructures.MacroControlStructure:
		w.fields(c)
		return &statement{cs: c, macro: c.Name, gathers: c.VarArgsName != "" || c.KwArgsName != ""}
	default:
		w.fields(cs)
	}
	ecs, ok := cs.(exec.ControlStructure)
	if !ok {
		w.fail("statement %s cannot run", cs)
		return cs
	}
	return &statement{cs: ecs}
}

// field is a settable view of a struct field, exported or not: gonja keeps
// some statements' expressions in unexported fields.
func field(ptr any, name string) reflect.Value {
	f := reflect.ValueOf(ptr).Elem().FieldByName(name)
	return reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem()
}

var (
	typeExpression  = reflect.TypeFor[nodes.Expression]()
	typeNode        = reflect.TypeFor[nodes.Node]()
	typeExpressions = reflect.TypeFor[[]nodes.Expression]()
	typeExprMap     = reflect.TypeFor[map[string]nodes.Expression]()
	typeWrapper     = reflect.TypeFor[*nodes.Wrapper]()
	typeWrappers    = reflect.TypeFor[[]*nodes.Wrapper]()
	typeFilterCalls = reflect.TypeFor[[]*nodes.FilterCall]()
	typeCall        = reflect.TypeFor[*nodes.Call]()
	typeMacro       = reflect.TypeFor[*nodes.Macro]()
	typeToken       = reflect.TypeFor[*tokens.Token]()
)

// fields rewrites every expression and body a statement holds, whatever
// its type; a field of a kind not known here fails the parse, so that a
// newer gonja cannot slip a statement past the rewrite.
func (w *rewriter) fields(cs any) {
	v := reflect.ValueOf(cs).Elem()
	for i := range v.NumField() {
		f := field(cs, v.Type().Field(i).Name)
		switch t := f.Type(); t {
		case typeExpression, typeNode:
			if !f.IsNil() {
				f.Set(reflect.ValueOf(w.expr(f.Interface().(nodes.Expression))))
			}
		case typeExpressions:
			exprs := f.Interface().([]nodes.Expression)
			for j := range exprs {
				exprs[j] = w.expr(exprs[j])
			}
		case typeExprMap:
			m := f.Interface().(map[string]nodes.Expression)
			for k, e := range m {
				m[k] = w.expr(e)
			}
		case typeWrapper:
			w.wrapper(f.Interface().(*nodes.Wrapper))
		case typeWrappers:
			for _, wr := range f.Interface().([]*nodes.Wrapper) {
				w.wrapper(wr)
			}
		case typeFilterCalls:
			for _, fc := range f.Interface().([]*nodes.FilterCall) {
				w.exprs(fc.Args)
				w.exprMap(fc.Kwargs)
			}
		case typeCall:
			if c := f.Interface().(*nodes.Call); c != nil {
				w.call(c)
			}
		case typeMacro:
			m := f.Interface().(*nodes.Macro)
			for _, p := range m.Kwargs {
				p.Value = w.expr(p.Value)
			}
			w.wrapper(m.Wrapper)
		case typeToken:
		default:
			switch t.Kind() {
			case reflect.String, reflect.Bool, reflect.Int:
			default:
				w.fail("kiln cannot check field %s (%s) of %T", v.Type().Field(i).Name, t, cs)
			}
		}
	}
}

func (w *rewriter) exprs(list []nodes.Expression) {
	for i := range list {
		list[i] = w.expr(list[i])
	}
}

func (w *rewriter) exprMap(m map[string]nodes.Expression) {
	for k, e := range m {
		m[k] = w.expr(e)
	}
}

func (w *rewriter) expr(n nodes.Expression) nodes.Expression {
	if n == nil {
		return nil
	}
	if r, ok := w.seen[n]; ok {
		return r
	}
	w.depth++
	defer func() { w.depth-- }()
	if w.depth > maxTree {
		w.fail("an expression nested more than %d deep", maxTree)
		return n
	}
	out := n
	switch n := n.(type) {
	case *nodes.None, *nodes.String, *nodes.Integer, *nodes.Float, *nodes.Bool, *nodes.Name, *nodes.Error:
	case *nodes.List:
		out = hook(hookList, n.Location, w.list(n.Val)...)
	case *nodes.Tuple:
		out = hook(hookList, n.Location, w.list(n.Val)...)
	case *nodes.Dict:
		var args []nodes.Expression
		for _, p := range n.Pairs {
			args = append(args, w.expr(p.Key), w.expr(p.Value))
		}
		out = hook(hookDict, n.Token, args...)
	case *nodes.Call:
		w.call(n)
	case *nodes.GetItem:
		n.Node, n.Arg = w.expr(n.Node), w.expr(n.Arg)
	case *nodes.GetSlice:
		n.Node, n.Start, n.End, n.Step = w.expr(n.Node), w.expr(n.Start), w.expr(n.End), w.expr(n.Step)
	case *nodes.GetAttribute:
		n.Node = w.expr(n.Node)
	case *nodes.Negation:
		n.Term = w.expr(n.Term)
	case *nodes.UnaryExpression:
		n.Term = w.expr(n.Term)
	case *nodes.BinaryExpression:
		n.Left, n.Right = w.expr(n.Left), w.expr(n.Right)
		switch n.Operator.Token.Type {
		case tokens.Addition:
			out = hook(hookAdd, n.Operator.Token, n.Left, n.Right)
		case tokens.Multiply:
			out = hook(hookMul, n.Operator.Token, n.Left, n.Right)
		case tokens.Tilde:
			out = hook(hookCat, n.Operator.Token, n.Left, n.Right)
		}
	case *nodes.FilteredExpression:
		n.Expression = w.expr(n.Expression)
		for _, fc := range n.Filters {
			w.exprs(fc.Args)
			w.exprMap(fc.Kwargs)
		}
	case *nodes.TestExpression:
		n.Expression = w.expr(n.Expression)
		w.exprs(n.Test.Args)
		w.exprMap(n.Test.Kwargs)
	default:
		w.fail("kiln cannot check expression %s (%T)", n, n)
	}
	w.seen[n] = out
	return out
}

func (w *rewriter) list(in []nodes.Expression) []nodes.Expression {
	out := make([]nodes.Expression, len(in))
	for i, e := range in {
		out[i] = w.expr(e)
	}
	return out
}

// call rewrites f(args) as \x00call(f, "f")(args) and x.m(args) as
// \x00method(x, "m")(args), in place.
func (w *rewriter) call(c *nodes.Call) {
	if _, seen := w.seen[c]; seen {
		return
	}
	w.seen[c] = c
	if attr, ok := c.Func.(*nodes.GetAttribute); ok && attr.Attribute != "" {
		name := &nodes.String{Location: &tokens.Token{Type: tokens.String, Val: attr.Attribute}, Val: attr.Attribute}
		c.Func = hook(hookMethod, c.Location, w.expr(attr.Node), name)
		c.Parent = nil
	} else {
		name := c.Func.String()
		if n, ok := c.Func.(*nodes.Name); ok {
			name = n.Name.Val
		}
		c.Func = hook(hookCall, c.Location, w.expr(c.Func), &nodes.String{Location: &tokens.Token{Type: tokens.String, Val: name}, Val: name})
	}
	w.exprs(c.Args)
	w.exprMap(c.Kwargs)
}

// hook is a call of one of kiln's hooks, given the line it stands for.
func hook(name string, pos *tokens.Token, args ...nodes.Expression) *nodes.Call {
	if pos == nil {
		pos = &tokens.Token{}
	}
	at := &tokens.Token{Type: tokens.Name, Val: name, Line: pos.Line, Col: pos.Col, Pos: pos.Pos}
	line := &nodes.Integer{Location: &tokens.Token{Type: tokens.Integer, Val: fmt.Sprint(pos.Line)}, Val: pos.Line}
	return &nodes.Call{Location: at, Func: &nodes.Name{Name: at}, Args: append([]nodes.Expression{line}, args...), Kwargs: map[string]nodes.Expression{}}
}

// statement runs a gonja statement as one step and one level of nesting.
// A macro's definition leaves its function guarded, so that a call that
// reaches it as a value (an argument, kwargs.f()) counts too.
type statement struct {
	cs      exec.ControlStructure
	macro   string
	gathers bool // the macro takes *args or **kwargs
}

func (s *statement) Position() *tokens.Token { return s.cs.Position() }
func (s *statement) String() string          { return s.cs.String() }

func (s *statement) Execute(r *exec.Renderer, tag *nodes.ControlStructureBlock) error {
	b := budgetOf(r.Environment.Context)
	b.line = s.Position().Line
	b.enter()
	defer b.leave()
	if err := s.cs.Execute(r, tag); err != nil {
		return err
	}
	if s.macro != "" {
		if m, ok := r.Environment.Context.Get(s.macro); ok {
			if m, ok := m.(exec.Macro); ok {
				r.Environment.Context.Set(s.macro, b.guard(m, s.gathers))
			}
		}
	}
	return nil
}

// outputNode is a value printed ({{ x }}), counted as it is written.
// parts, when set, are the operands of its expression, a chain of + over
// literals, names and their attributes and items: when they are all
// strings they are printed one after the other, without building the sum
// (each + copied a message's text again: a conversation's 70 KB document
// took 0.2 ms more to render than its follow-ups' words).
type outputNode struct {
	out   *nodes.Output
	parts []nodes.Expression
}

func (o *outputNode) Position() *tokens.Token { return o.out.Start }
func (o *outputNode) String() string          { return o.out.String() }

func (o *outputNode) Execute(r *exec.Renderer, _ *nodes.ControlStructureBlock) error {
	b := budgetOf(r.Environment.Context)
	b.line = o.out.Start.Line
	b.step(1)
	sub := *r
	sub.Output = &countingWriter{b, r.Output}
	if o.parts != nil && !r.Config.AutoEscape && !b.plain {
		if strs, ok := evalStrings(&sub, o.parts); ok {
			for _, s := range strs {
				if _, err := io.WriteString(sub.Output, s); err != nil {
					return err
				}
			}
			return nil
		}
	}
	_, err := sub.Visit(o.out)
	return err
}

// evalStrings evaluates parts, which have no effects, and returns them if
// they are all strings.
func evalStrings(r *exec.Renderer, parts []nodes.Expression) ([]string, bool) {
	strs := make([]string, len(parts))
	for i, p := range parts {
		v := r.Eval(p)
		if v.IsError() || !v.IsString() {
			return nil, false
		}
		strs[i] = v.String()
	}
	return strs, true
}

// concatParts returns the operands of an output's expression when it is a
// chain of + (the rewritten hookAdd calls) whose operands are literal
// strings, names, and attributes and items of those: lookups, which can be
// evaluated twice (once here, once by the plain path) to the same effect.
func concatParts(n *nodes.Output) []nodes.Expression {
	if n.Condition != nil || !isAdd(n.Expression) {
		return nil
	}
	var parts []nodes.Expression
	e := n.Expression
	for isAdd(e) {
		c := e.(*nodes.Call)
		parts = append(parts, c.Args[2])
		e = c.Args[1]
	}
	parts = append(parts, e)
	slices.Reverse(parts)
	for _, p := range parts {
		if !lookup(p) {
			return nil
		}
	}
	return parts
}

// isAdd reports whether e is a rewritten +: hook(hookAdd, line, l, r).
func isAdd(e nodes.Expression) bool {
	c, ok := e.(*nodes.Call)
	if !ok || len(c.Args) != 3 {
		return false
	}
	f, ok := c.Func.(*nodes.Name)
	return ok && f.Name.Val == hookAdd
}

// lookup reports whether e is a literal string or integer, a name, or an
// attribute or item of one (with one of those for its key).
func lookup(e nodes.Expression) bool {
	switch e := e.(type) {
	case *nodes.String, *nodes.Integer, *nodes.Name:
		return true
	case *nodes.GetAttribute:
		return lookup(e.Node)
	case *nodes.GetItem:
		return lookup(e.Node) && lookup(e.Arg)
	}
	return false
}

// countingWriter charges what is written through it.
type countingWriter struct {
	b *budget
	w io.Writer
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.b.build(len(p))
	return c.w.Write(p)
}

// WriteString charges s before it is copied anywhere: a message over the
// limit fails without a byte of it built.
func (c *countingWriter) WriteString(s string) (int, error) {
	c.b.build(len(s))
	return io.WriteString(c.w, s)
}

// textNode is a piece of the template's text, counted as it is written.
type textNode struct {
	s   string
	pos *tokens.Token
}

func (t *textNode) Position() *tokens.Token { return t.pos }
func (t *textNode) String() string          { return "text" }

func (t *textNode) Execute(r *exec.Renderer, _ *nodes.ControlStructureBlock) error {
	b := budgetOf(r.Environment.Context)
	b.step(1)
	b.build(len(t.s))
	_, err := io.WriteString(r.Output, t.s)
	return err
}

func budgetOf(ctx *exec.Context) *budget {
	b, _ := ctx.Get(budgetKey)
	return b.(*budget)
}
