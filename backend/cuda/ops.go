//go:build cgo

package cuda

import (
	"fmt"
	"os"
	"strconv"

	"github.com/kiln-llm/kiln/backend"
)

// run launches kernel name on the stream; a launch error is kept for Sync.
func (b *Backend) run(name string, grid [3]int, block, smem int, vs ...any) {
	b.launchKernel(name, false, grid, block, smem, vs...)
}

// runOverlapped launches a kernel that calls pdl_wait before it touches
// memory that other kernels write or read: with b.pdl it may start while
// the previous kernel finishes (programmatic dependent launch).
func (b *Backend) runOverlapped(name string, grid [3]int, block, smem int, vs ...any) {
	b.launchKernel(name, b.pdl, grid, block, smem, vs...)
}

func (b *Backend) launchKernel(name string, pdl bool, grid [3]int, block, smem int, vs ...any) {
	if grid[0] == 0 || grid[1] == 0 || grid[2] == 0 {
		return
	}
	var a args
	a.add(vs...)
	if b.trace != nil {
		b.trace(name)
	}
	label := name
	if b.prof != nil {
		label = fmt.Sprintf("%s %v", name, grid) // the grid tells the calls of a kernel apart
	}
	b.around(label, func() { b.fail(launch(b.k.get(name), grid, block, smem, b.stream, &a, pdl)) })
}

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

func boolInt(v bool) int {
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

// int64Arg passes a 64-bit count to a kernel (a long parameter).
type int64Arg int64
