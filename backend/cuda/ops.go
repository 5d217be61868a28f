//go:build cgo

package cuda

import (
	"fmt"
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

func envInt(name string, def, lo, hi int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v >= lo && v <= hi {
		return v
	}
	return def
}
