//go:build cgo

package cuda

/*
#cgo LDFLAGS: -ldl
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"
)

// Driver API constants used by the package (values from cuda.h).
const (
	attrMultiprocessors = 16
	attrCCMajor         = 75
	attrCCMinor         = 76
	attrSharedOptin     = 97
	attrSharedPerSM     = 81
	funcMaxDynamicSmem  = 8
	funcSmemCarveout    = 9
	captureRelaxed      = 2
)

type cuError struct {
	call string
	code int
}

func (e *cuError) Error() string {
	return fmt.Sprintf("cuda: %s failed: %s (%d)", e.call, cuErrName(e.code), e.code)
}

// cuErrName names the driver errors kiln can run into.
func cuErrName(code int) string {
	switch code {
	case 1:
		return "invalid value"
	case 2:
		return "out of memory"
	case 3:
		return "not initialized"
	case 100:
		return "no device"
	case 101:
		return "invalid device"
	case 200:
		return "invalid image"
	case 209:
		return "no binary for GPU"
	case 218:
		return "invalid PTX"
	case 300:
		return "invalid source"
	case 400:
		return "invalid handle"
	case 500:
		return "not found"
	case 700:
		return "illegal address"
	case 701:
		return "launch out of resources"
	case 702:
		return "launch timeout"
	case 719:
		return "launch failed"
	case 900:
		return "operation not permitted when stream is capturing"
	case 901:
		return "stream capture invalidated"
	case 999:
		return "unknown"
	}
	return "error"
}

func check(call string, r C.int) error {
	if r != 0 {
		return &cuError{call, int(r)}
	}
	return nil
}

type (
	devptr = C.CUdeviceptr
	stream = C.CUstream
	kfunc  = C.CUfunction
)

func loadErr(f func(*C.char, C.int) C.int) error {
	buf := make([]byte, 512)
	if f((*C.char)(unsafe.Pointer(&buf[0])), C.int(len(buf))) != 0 {
		n := 0
		for n < len(buf) && buf[n] != 0 {
			n++
		}
		return errors.New(string(buf[:n]))
	}
	return nil
}

func loadDriver() error {
	return loadErr(func(b *C.char, n C.int) C.int { return C.load_cuda(b, n) })
}
func loadNVRTC() error {
	return loadErr(func(b *C.char, n C.int) C.int { return C.load_nvrtc(b, n) })
}
func loadCublasLt() error {
	return loadErr(func(b *C.char, n C.int) C.int { return C.load_lt(b, n) })
}

func unsafePtr[T any](p *T) unsafe.Pointer { return unsafe.Pointer(p) }

func (b *Backend) copyDtoD(dst, src devptr, n int) {
	b.fail(check("cuMemcpyDtoDAsync", C.k_cuMemcpyDtoDAsync_v2(b.ctx, dst, src, C.size_t(n), b.stream)))
}

// copyDtoH queues a copy from the device to pinned host memory.
func (b *Backend) copyDtoH(dst unsafe.Pointer, src devptr, n int) {
	b.fail(check("cuMemcpyDtoHAsync", C.k_cuMemcpyDtoHAsync_v2(b.ctx, dst, src, C.size_t(n), b.stream)))
}

// stageToDevice queues a copy of src to dst through half h (of size bytes)
// of the pinned buffer stage: it waits for that half's last copy to the
// device, fills it and queues its copy, so that the host fills one half
// while the other crosses the bus.
func (b *Backend) stageToDevice(dst devptr, src []byte, stage unsafe.Pointer, h, size int) error {
	if err := check("cuEventSynchronize", C.k_cuEventSynchronize(b.ctx, b.halfDone[h])); err != nil {
		return err
	}
	half := unsafe.Add(stage, h*size)
	copy(unsafe.Slice((*byte)(half), len(src)), src)
	b.copyHtoD(dst, half, len(src))
	return check("cuEventRecord", C.k_cuEventRecord(b.ctx, b.halfDone[h], b.stream))
}

// copyHtoD queues a copy from pinned host memory to the device.
func (b *Backend) copyHtoD(dst devptr, src unsafe.Pointer, n int) {
	b.fail(check("cuMemcpyHtoDAsync", C.k_cuMemcpyHtoDAsync_v2(b.ctx, dst, src, C.size_t(n), b.stream)))
}

func (b *Backend) freePtr(p devptr) {
	b.fail(check("cuMemFree", C.k_cuMemFree_v2(b.ctx, p)))
}

// preferSmem asks for the largest shared-memory carveout for a kernel
// (once per kernel): left to itself the driver chose one that ran
// moe_group_mm64's 46 KB blocks two a multiprocessor where four fit (ncu,
// H100, 2026-11-28).
func (b *Backend) preferSmem(name string) {
	key := name + "#carveout"
	if _, ok := b.k.funcs[key]; ok {
		return
	}
	b.fail(check("cuFuncSetAttribute", C.k_cuFuncSetAttribute(b.ctx, b.k.get(name), funcSmemCarveout, 100)))
	b.k.funcs[key] = nil
}

type residentKey struct {
	name          string
	threads, smem int
}

// residentBlocks is how many blocks of threads threads and smem bytes of
// dynamic shared memory of kernel name one multiprocessor holds at once
// (its registers and shared memory allow; at least 1), asked of the driver
// once per shape. A kernel over 48 KB must have had allowSmem first.
func (b *Backend) residentBlocks(name string, threads, smem int) int {
	key := residentKey{name, threads, smem}
	if n, ok := b.resident[key]; ok {
		return n
	}
	var n C.int
	b.fail(check("cuOccupancyMaxActiveBlocksPerMultiprocessor", C.k_cuOccupancyMaxActiveBlocksPerMultiprocessor(b.ctx, &n, b.k.get(name), C.int(threads), C.size_t(smem))))
	b.resident[key] = max(int(n), 1)
	return b.resident[key]
}

// allowSmem raises a kernel's dynamic shared memory limit (once per kernel).
func (b *Backend) allowSmem(name string, n int) {
	if n > b.smemOp {
		panic(fmt.Sprintf("cuda: %s needs %d bytes of shared memory, the device allows %d", name, n, b.smemOp))
	}
	key := name + "#smem"
	if _, ok := b.k.funcs[key]; ok {
		return
	}
	b.fail(check("cuFuncSetAttribute", C.k_cuFuncSetAttribute(b.ctx, b.k.get(name), funcMaxDynamicSmem, C.int(n))))
	b.k.funcs[key] = nil
}
