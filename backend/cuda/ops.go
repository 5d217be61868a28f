//go:build cgo

package cuda

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"

	"github.com/kiln-llm/kiln/backend"
)

func g1(n int) [3]int { return [3]int{n, 1, 1} }

// blocksFor is a grid-stride launch size for n elements.
func (b *Backend) blocksFor(n int) int { return max(1, min((n+255)/256, 8*b.sms)) }

func checkRows(what string, t *tensor, rows, cols int) {
	if t.rows() != rows || t.cols() != cols {
		panic(fmt.Sprintf("cuda: %s is %v, want [%d, %d]", what, t, rows, cols))
	}
}

func checkF32(what string, ts ...*tensor) {
	for _, t := range ts {
		if t.dt != backend.F32 {
			panic(fmt.Sprintf("cuda: %s: %v must be f32", what, t))
		}
	}
}

// checkAct panics unless each tensor is f32 or bf16 (ActivationType).
func checkAct(what string, ts ...*tensor) {
	for _, t := range ts {
		if t.dt != backend.F32 && t.dt != backend.BF16 {
			panic(fmt.Sprintf("cuda: %s: %v must be f32 or bf16", what, t))
		}
	}
}

// boolInt is a flag argument of a kernel (an int parameter).
func boolInt(v bool) int32 {
	if v {
		return 1
	}
	return 0
}

// envInt returns the integer environment variable name, def when it is
// unset or empty; a value that is no integer in [lo, hi] is ignored with a
// warning.
func envInt(name string, def, lo, hi int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < lo || v > hi {
		slog.Warn("cuda: ignoring an environment variable outside its range", "name", name, "value", s, "min", lo, "max", hi, "default", def)
		return def
	}
	return v
}
