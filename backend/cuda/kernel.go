//go:build cgo

package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"reflect"
	"runtime"
	"unsafe"
)

// kernel is a kernel of kernels/*.cu that takes the arguments A: a struct
// whose fields are the kernel's parameters in order (an embedded struct's
// fields in its place), named as in the source, each of its C type's Go
// counterpart (a pointer a devptr, int an int32, long an int64, float a
// float32, a struct passed by value a struct of those). A launch names
// every argument, and the struct is the argument buffer: the driver reads
// each parameter at its field's offset. The kernels a macro stamps out are
// tables by shape (the tokens, the tile, the type), indexed at the launch.
// TestKernelSignatures checks, without a GPU, every kernel declared here
// against the preprocessed sources, and that every kernel there is
// declared.
type kernel[A any] struct{ *kernelDef }

// kernelDef is a kernel's name and where its arguments lie in their struct.
type kernelDef struct {
	name string
	args reflect.Type
	offs []C.int
}

// kernelDefs are the kernels the package declares (newKernel).
var kernelDefs []*kernelDef

// newKernel declares the kernel name, which takes the arguments A.
func newKernel[A any](name string) kernel[A] {
	t := reflect.TypeFor[A]()
	if t.Kind() != reflect.Struct || t.NumField() == 0 {
		panic(fmt.Sprintf("cuda: kernel %s: arguments %v are not a struct", name, t))
	}
	d := &kernelDef{name: name, args: t}
	for _, f := range kernelParams(t) {
		if !kernelArg(f.Type) {
			panic(fmt.Sprintf("cuda: kernel %s: argument %s is a %v", name, f.Name, f.Type))
		}
		d.offs = append(d.offs, C.int(f.Offset))
	}
	if len(d.offs) > C.K_MAX_ARGS {
		panic(fmt.Sprintf("cuda: kernel %s: %d arguments, k_launch takes %d", name, len(d.offs), C.K_MAX_ARGS))
	}
	kernelDefs = append(kernelDefs, d)
	return kernel[A]{d}
}

// kernelParams returns the parameters of a kernel that takes arguments t:
// its fields, those of an embedded struct in its place (a family of kernels
// whose parameters extend another's), with offsets from the start of t.
func kernelParams(t reflect.Type) []reflect.StructField {
	var ps []reflect.StructField
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.Anonymous {
			ps = append(ps, f)
			continue
		}
		for _, g := range kernelParams(f.Type) {
			g.Offset += f.Offset
			ps = append(ps, g)
		}
	}
	return ps
}

// kernelArg reports whether a kernel parameter may be of Go type t: a
// device pointer, a 32- or 64-bit integer, a float32, or arrays and structs
// of those (passed by value).
func kernelArg(t reflect.Type) bool {
	switch t {
	case reflect.TypeFor[devptr](), reflect.TypeFor[int32](), reflect.TypeFor[int64](), reflect.TypeFor[float32]():
		return true
	}
	switch t.Kind() {
	case reflect.Array:
		return kernelArg(t.Elem())
	case reflect.Struct:
		for i := range t.NumField() {
			if !kernelArg(t.Field(i).Type) {
				return false
			}
		}
		return t.NumField() > 0
	}
	return false
}

// kernelFor returns the kernel of a family (a table by shape) for shape s;
// it panics naming s if the sources compile none for it.
func kernelFor[S comparable, A any](family map[S]kernel[A], s S) kernel[A] {
	k, ok := family[s]
	if !ok {
		panic(fmt.Sprintf("cuda: no %T kernel for %+v", *new(A), s))
	}
	return k
}

// run launches k on the stream; a launch error is kept for Sync.
func (k kernel[A]) run(b *Backend, grid [3]int, block, smem int, a A) {
	b.launchKernel(k.kernelDef, false, grid, block, smem, unsafe.Pointer(&a))
}

// runOverlapped launches a kernel that calls pdl_wait before it touches
// memory that other kernels write or read: with b.pdl it may start while
// the previous kernel finishes (programmatic dependent launch).
func (k kernel[A]) runOverlapped(b *Backend, grid [3]int, block, smem int, a A) {
	b.launchKernel(k.kernelDef, b.pdl, grid, block, smem, unsafe.Pointer(&a))
}

// launch is runOverlapped when overlap is set, else run.
func (k kernel[A]) launch(b *Backend, overlap bool, grid [3]int, block, smem int, a A) {
	b.launchKernel(k.kernelDef, overlap && b.pdl, grid, block, smem, unsafe.Pointer(&a))
}

// launchKernel starts kernel k with the arguments at args (its struct);
// with pdl it may overlap the previous kernel of the stream (see k_launch),
// which only kernels that call pdl_wait allow.
func (b *Backend) launchKernel(k *kernelDef, pdl bool, grid [3]int, block, smem int, args unsafe.Pointer) {
	if grid[0] == 0 || grid[1] == 0 || grid[2] == 0 {
		return
	}
	if b.trace != nil {
		b.trace(k.name)
	}
	label := k.name
	if b.prof != nil {
		label = fmt.Sprintf("%s %v", k.name, grid) // the grid tells the calls of a kernel apart
	}
	p := C.int(0)
	if pdl {
		p = 1
	}
	b.around(label, func() {
		r := C.k_launch(b.ctx, b.k.get(k.name), C.uint(grid[0]), C.uint(grid[1]), C.uint(grid[2]), C.uint(block), C.uint(smem), b.stream,
			(*C.char)(args), &k.offs[0], C.int(len(k.offs)), p)
		runtime.KeepAlive(args)
		b.fail(check("cuLaunchKernel", r))
	})
}
