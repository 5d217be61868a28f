//go:build cgo

package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/kiln-llm/kiln/backend"
)

// Options configures a Backend.
type Options struct {
	// Device is the CUDA device ordinal.
	Device int
	// CacheDir holds compiled kernels; empty means $XDG_CACHE_HOME/kiln/kernels
	// or ~/.cache/kiln/kernels.
	CacheDir string
}

// Backend runs kiln's operations on one NVIDIA GPU. Like every backend it is
// used by one goroutine at a time.
type Backend struct {
	name string
	arch string // e.g. "sm_90a"
	// ctx is the device's primary context, which every driver call of the
	// backend runs in (shim.c: use_ctx).
	ctx    C.CUcontext
	device int
	// group, rank and the communicators: the backend's place in a group of
	// GPUs that run a model split across them (collective.go); nil, 0 and
	// nil alone. comm carries the collectives issued as they come, graphComm
	// those captured in graphs (NCCL's graph mixing support is off).
	group     *group
	rank      int
	comm      C.ncclComm_t
	graphComm C.ncclComm_t
	ncclMu    sync.Mutex // held across an NCCL call (ncclCall), taken by Abort

	sms    int
	smemOp int // opt-in shared memory per block
	smemSM int // shared memory per multiprocessor
	stream stream
	k      *kernels
	lt     *blasLt

	err error // first error of queued work, returned by Sync

	meta    stepMeta
	graphs  map[string]*graph
	capture bool

	scratch map[string]*tensor
	retired []devptr // scratch replaced while graphs may still use it
	// resident: blocks of a kernel one multiprocessor holds at once, by
	// launch shape (residentBlocks).
	resident map[residentKey]int

	// Tuning knobs, fixed at New from the environment (doc.go).
	gemvMax, gemvWarps, splitMax, splitBlocks int
	mmaSplitBlocks, skinnyMax, routerGemm     int
	// flashSplitQueries: the query tile (64 or 128) of the flash prefill
	// kernel where it splits the keys (head dims 64 and 128).
	flashSplitQueries int
	useGraphs         bool // KILN_CUDA_GRAPHS is not 0
	// skinnyCnt holds the split-K counters of the skinny GEMM and of
	// f8wg, one per tile (at most skinnyWave() tiles), zeroed once; each
	// call's last block resets the ones it used.
	skinnyCnt devptr
	// pdl lets the kernels launched by runOverlapped start while the
	// kernel before them finishes (sm_90 on; KILN_CUDA_PDL=0 turns it off).
	pdl  bool
	prof *profiler
	// qgemvMax is the most tokens of a quantized product on qgemv,
	// qgemvGrid the most blocks it launches (0: a wave) and qgemvWarps
	// its blocks' warps (0: qgemvBlock's choice); qmvMax the most tokens on
	// qmv, and qmvGrid the most blocks (0: a block an output group); qSlab the most weight elements dequantized to bf16 at a time
	// for cuBLASLt (see quant.go).
	qgemvMax, qgemvGrid, qgemvWarps, qmvMax, qmvGrid, qSlab, qmvWarpsMax int
	// fp8Min is the fewest tokens of a product with an FP8 weight that runs
	// as a block-scaled FP8 GEMM (fp8.go); 0: never (before Hopper).
	// fp8SkinnyMax is the most tokens of one on the FP8 skinny GEMM
	// (skinny.go); 0: none (before sm_89, or NVRTC before 12.4).
	// f8mvMax is the most tokens of a product on f8mv (quant.go), which
	// takes FP8 expert rows from 0; -1: no f8mv (as fp8SkinnyMax 0).
	// f8mvOuts and f8mvCols are the fewest outputs and the most columns
	// of a product on it.
	// f8wgMax is the most tokens of a block-scaled product on f8wg
	// (wgmma, sm_90a) rather than cuBLASLt; 0: none.
	fp8Min, fp8SkinnyMax, f8mvMax, f8mvOuts, f8mvCols, f8wgMax int
	// moeWG: the experts' grouped products run on wgmma (sm_90a): bf16
	// experts, and FP8 ones where fp8Min is set (groupWG, groupF8;
	// KILN_CUDA_MOE_WG=0 for A/B). flashWG: long prompts' attention runs
	// its scores on wgmma (flash_wg; KILN_CUDA_FLASH_WG=0 for A/B).
	moeWG, flashWG bool
	// fusedDecode: a decode step's attention (one token a sequence, a
	// block a token and kv head) is one kernel, attn_decode_fused, where the
	// bf16 tensor-core kernel applies (KILN_CUDA_FUSED_DECODE=0 for A/B).
	fusedDecode bool
	// moeSum: the down product of a decode step's expert rows adds them to
	// the residual itself where it can (f8mv), with no moe_combine
	// (KILN_CUDA_MOE_SUM=0 for A/B).
	moeSum bool
	// trace, when set (tests), is told the name of every kernel launched
	// and "cublasLt" for every cuBLASLt product.
	trace func(name string)

	pinned     unsafe.Pointer // host staging for reads and restores
	pinnedSize int
	// samplings are the page-locked buffers samplings' arguments go up
	// from and their results come back to, two so that a step can be
	// issued between a SampleStart and its wait; next is the one to use.
	// sampled and sampledRows are the last one's tokens on the device
	// (Batch.Fed).
	samplings   [2]sampling
	nextSample  int
	sampled     devptr
	sampledRows int
	// argmax: greedy rows that ask for nothing else go to argmax_rows
	// (KILN_CUDA_ARGMAX=0: through the sampler's three kernels, as others).
	argmax bool
	// hostBufs are the page-locked buffers HostBuffer gave out.
	hostBufs []hostBuf
	// halfDone marks, for each half of the staging buffer, the end of the
	// last copy to the device from it (moveBlocks).
	halfDone [2]C.CUevent
}

var (
	_ backend.Backend        = (*Backend)(nil)
	_ backend.FusedAttention = (*Backend)(nil)
	_ backend.FusedMoE       = (*Backend)(nil)
	_ backend.StateCapturer  = (*Backend)(nil)
	_ backend.HostMemory     = (*Backend)(nil)
)

// New opens the driver and the device. It returns an error saying why when
// no usable GPU is present (no libcuda, no device, kernel compilation failed).
func New(opts Options) (*Backend, error) {
	n, err := deviceCount()
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, errors.New("cuda: no CUDA device")
	}
	if opts.Device < 0 || opts.Device >= n {
		return nil, fmt.Errorf("cuda: device %d of %d", opts.Device, n)
	}
	var dev C.CUdevice
	if err := check("cuDeviceGet", C.k_cuDeviceGet(nil, &dev, C.int(opts.Device))); err != nil {
		return nil, err
	}
	attr := func(a int) (int, error) {
		var v C.int
		err := check("cuDeviceGetAttribute", C.k_cuDeviceGetAttribute(nil, &v, C.int(a), dev))
		return int(v), err
	}
	b := &Backend{graphs: map[string]*graph{}, scratch: map[string]*tensor{}, resident: map[residentKey]int{}, device: opts.Device}
	var name [256]C.char
	if err := check("cuDeviceGetName", C.k_cuDeviceGetName(nil, &name[0], 256, dev)); err != nil {
		return nil, err
	}
	b.name = C.GoString(&name[0])
	major, err1 := attr(attrCCMajor)
	minor, err2 := attr(attrCCMinor)
	sms, err3 := attr(attrMultiprocessors)
	smem, err4 := attr(attrSharedOptin)
	smemSM, err5 := attr(attrSharedPerSM)
	if err := errors.Join(err1, err2, err3, err4, err5); err != nil {
		return nil, err
	}
	b.sms, b.smemOp, b.smemSM = sms, smem, smemSM
	b.arch = fmt.Sprintf("sm_%d%d", major, minor)
	if major >= 9 {
		b.arch += "a" // the architecture-specific target: wgmma, setmaxnreg
	}
	if err := check("cuDevicePrimaryCtxRetain", C.k_cuDevicePrimaryCtxRetain(nil, &b.ctx, dev)); err != nil {
		return nil, err
	}
	if err := check("cuStreamCreate", C.k_cuStreamCreate(b.ctx, &b.stream, 1)); err != nil {
		return nil, err
	}
	for i := range b.halfDone {
		if err := check("cuEventCreate", C.k_cuEventCreate(b.ctx, &b.halfDone[i], 2)); err != nil { // 2: disable timing
			return nil, err
		}
	}
	for i := range b.samplings {
		if err := check("cuEventCreate", C.k_cuEventCreate(b.ctx, &b.samplings[i].done, 2)); err != nil {
			return nil, err
		}
	}
	k, err := compileKernels(b.ctx, b.arch, opts.CacheDir)
	if err != nil {
		return nil, err
	}
	b.k = k
	b.gemvMax = envInt("KILN_CUDA_GEMV_MAX", gemvMaxTokens, 0, gemvTokens)
	b.gemvWarps = envInt("KILN_CUDA_GEMV_WARPS", 8, 1, 8) // rows (warps) per block
	if os.Getenv("KILN_CUDA_PROFILE") == "1" {
		b.prof = &profiler{total: map[string]float64{}, count: map[string]int{}}
	}
	b.splitMax = envInt("KILN_CUDA_SPLITS", 512, 1, 512)
	// Six decode-attention blocks per multiprocessor measured best on an
	// H100 (2, 3, 4, 6 and 8 tried at batch 1 and 64, contexts 1K and 32K).
	b.splitBlocks = envInt("KILN_CUDA_SPLIT_BLOCKS", 6, 1, 64)
	// The tensor-core kernel (bf16 caches) holds two blocks per Hopper
	// multiprocessor (shared memory; one on GPUs of 100 KB,
	// decodeMMAPerSM); two splits per multiprocessor measured best (2, 3, 4,
	// 6 and 8 tried at batch 1 and 16, contexts 1K to 32K).
	b.mmaSplitBlocks = envInt("KILN_CUDA_MMA_SPLIT_BLOCKS", 2, 1, 64)
	b.flashSplitQueries = envInt("KILN_CUDA_FLASH_SPLIT_QUERIES", 128, 64, 128)
	b.fusedDecode = os.Getenv("KILN_CUDA_FUSED_DECODE") != "0"
	b.moeSum = os.Getenv("KILN_CUDA_MOE_SUM") != "0"
	b.pdl = major >= 9 && envInt("KILN_CUDA_PDL", 1, 0, 1) == 1
	b.skinnyMax = envInt("KILN_CUDA_SKINNY_MAX", skinnyMaxTokens, 0, skinnyMaxTokens)
	b.qgemvMax = envInt("KILN_CUDA_QGEMV_MAX", qgemvMaxTokens, 0, qgemvTokens)
	if b.qgemvWarps = envInt("KILN_CUDA_QGEMV_WARPS", 0, 0, qgemvWarpsSM); b.qgemvWarps != 0 && b.qgemvWarps != 8 && b.qgemvWarps != 12 && b.qgemvWarps != qgemvWarpsSM {
		slog.Warn("cuda: ignoring KILN_CUDA_QGEMV_WARPS: not 8, 12 or 24", "value", b.qgemvWarps)
		b.qgemvWarps = 0
	}
	b.qgemvGrid = envInt("KILN_CUDA_QGEMV_GRID", 0, 0, 1<<20)
	b.qmvMax = envInt("KILN_CUDA_QMV_MAX", qmvMaxTokens, 0, qmvMaxTokens)
	b.qmvGrid = envInt("KILN_CUDA_QMV_GRID", qmvBlocksSM*b.sms, 0, 1<<20)
	b.qSlab = qSlabElems
	b.qmvWarpsMax = envInt("KILN_CUDA_QMV_WARPS", 8, 1, 8)
	b.routerGemm = envInt("KILN_CUDA_ROUTER_GEMM", moeRouterGemm, 0, 1<<30)
	b.useGraphs = os.Getenv("KILN_CUDA_GRAPHS") != "0"
	b.argmax = os.Getenv("KILN_CUDA_ARGMAX") != "0"
	if major == 9 { // cuBLASLt's FP8 block scaling is Hopper's
		b.fp8Min = envInt("KILN_CUDA_FP8_GEMM_MIN", fp8GemmMinTokens, 0, 1<<20)
		if b.fp8Min > 0 {
			b.fp8Min = max(b.fp8Min, fp8GemmMinTokens)
		}
		b.moeWG = strings.HasSuffix(b.arch, "a") && os.Getenv("KILN_CUDA_MOE_WG") != "0"
		if b.fp8Min > 0 && strings.HasSuffix(b.arch, "a") {
			b.f8wgMax = envInt("KILN_CUDA_F8WG_MAX", f8wgMaxTokens, 0, f8wgMaxTokens)
		}
		b.flashWG = strings.HasSuffix(b.arch, "a") && os.Getenv("KILN_CUDA_FLASH_WG") != "0"
	}
	b.f8mvMax = -1
	if 10*major+minor >= 89 && k.nvrtc >= nvrtcVersion(12, 4) { // F8_MMA in kernels/common.cuh
		// On Hopper the skinny GEMM is the faster up to two tokens; from
		// three qmv, from four the block-scaled products (f8wg, then
		// cuBLASLt; NOTES.md).
		def := skinnyMaxTokens
		if b.fp8Min > 0 {
			def = 2
		}
		b.fp8SkinnyMax = envInt("KILN_CUDA_FP8_SKINNY_MAX", def, 0, skinnyMaxTokens)
		b.f8mvMax = envInt("KILN_CUDA_F8MV_MAX", f8mvMaxTokens, -1, f8mvTokens)
		b.f8mvOuts = envInt("KILN_CUDA_F8MV_OUTS", f8mvOuts, 0, 1<<30)
		b.f8mvCols = envInt("KILN_CUDA_F8MV_COLS", f8mvCols, 0, 1<<30)
	}
	// Split tiles are at most half a wave of blocks.
	ncnt := b.skinnyWave()
	if b.skinnyCnt, err = b.malloc(4 * ncnt); err != nil {
		return nil, err
	}
	if err := check("cuMemsetD32Async", C.k_cuMemsetD32Async(b.ctx, b.skinnyCnt, 0, C.size_t(ncnt), b.stream)); err != nil {
		return nil, err
	}
	lt, err := newBlasLt(b.ctx, b.stream)
	if err != nil {
		return nil, err
	}
	b.lt = lt
	if err := b.meta.init(b); err != nil {
		return nil, err
	}
	return b, nil
}

// Name reports the device, e.g. "cuda (NVIDIA H100 80GB HBM3, sm_90a)".
func (b *Backend) Name() string { return fmt.Sprintf("cuda (%s, %s)", b.name, b.arch) }

// WeightsInPlace reports false: Load uploads the weights, so the files they
// came from can be closed.
func (b *Backend) WeightsInPlace() bool { return false }

// FreeMemory returns the device memory not yet allocated, in bytes: on a
// rank of a group, the least of its GPUs'.
func (b *Backend) FreeMemory() int64 { return b.groupFree() }

// CopyBandwidth measures what a decode step's floor divides its bytes by:
// bytes read plus written a second by device-to-device copies of up to 1
// GiB (the best of five rounds of four), with a quarter of the free memory
// at most.
func (b *Backend) CopyBandwidth() (float64, error) {
	n := int(min(1<<30, b.deviceFree()/8))
	if n < 64<<20 {
		return 0, fmt.Errorf("cuda: %d MiB free on GPU %d, too little to measure its copy rate", b.deviceFree()>>20, b.device)
	}
	src, err := b.malloc(n)
	if err != nil {
		return 0, err
	}
	defer b.freePtr(src)
	dst, err := b.malloc(n)
	if err != nil {
		return 0, err
	}
	defer b.freePtr(dst)
	b.copyDtoD(dst, src, n) // the first copy maps the pages
	if err := b.Sync(); err != nil {
		return 0, err
	}
	best := 0.0
	for range 5 {
		start := time.Now()
		for range 4 {
			b.copyDtoD(dst, src, n)
		}
		if err := b.Sync(); err != nil {
			return 0, err
		}
		best = max(best, 4*2*float64(n)/time.Since(start).Seconds())
	}
	return best, nil
}

// deviceFree is the memory free on the backend's GPU.
func (b *Backend) deviceFree() int64 {
	var free, total C.size_t
	if err := check("cuMemGetInfo", C.k_cuMemGetInfo_v2(b.ctx, &free, &total)); err != nil {
		b.fail(err)
		return 0
	}
	return int64(free)
}

// fail records the first error of queued work.
func (b *Backend) fail(err error) {
	if err != nil && b.err == nil {
		b.err = err
	}
}

// tensor is a device buffer with a shape; views share their base's memory.
type tensor struct {
	dt    backend.DType
	shape []int
	ptr   devptr
	view  bool
	fp8t  devptr // an FP8 weight's tile scales for the block-scaled GEMM (fp8.go), or 0
}

func (t *tensor) DType() backend.DType { return t.dt }
func (t *tensor) Shape() []int         { return t.shape }
func (t *tensor) String() string       { return fmt.Sprintf("%v%v", t.dt, t.shape) }
func (t *tensor) numel() int           { return shapeSize(t.shape) }

// bytes is the tensor's size on the device; a quantized tensor is rows of
// its innermost dimension in the device layout (qlayout.go).
func (t *tensor) bytes() int {
	if t.dt.Quantized() {
		return t.qrows() * qRowBytes(t.dt, t.qcols())
	}
	return t.numel() * t.dt.Size()
}

// qcols and qrows view a quantized tensor as a matrix of rows of its
// innermost dimension (experts stacked by rows).
func (t *tensor) qcols() int {
	if len(t.shape) == 0 {
		return 1
	}
	return t.shape[len(t.shape)-1]
}

func (t *tensor) qrows() int {
	n := 1
	if len(t.shape) > 0 {
		n = shapeSize(t.shape[:len(t.shape)-1])
	}
	return n
}

// rb is the device bytes of one row of a quantized tensor.
func (t *tensor) rb() int { return qRowBytes(t.dt, t.qcols()) }

// rows and cols view t as a matrix of its first dimension by the rest.
func (t *tensor) rows() int { return t.shape[0] }
func (t *tensor) cols() int {
	n := 1
	for _, d := range t.shape[1:] {
		n *= d
	}
	return n
}

func shapeSize(shape []int) int {
	n := 1
	for _, d := range shape {
		if d < 0 {
			panic(fmt.Sprintf("cuda: negative dimension in %v", shape))
		}
		n *= d
	}
	return n
}

func asT(t backend.Tensor) *tensor {
	c, ok := t.(*tensor)
	if !ok {
		panic(fmt.Sprintf("cuda: tensor of another backend (%T)", t))
	}
	return c
}

func (b *Backend) malloc(n int) (devptr, error) {
	var p devptr
	if n == 0 {
		n = 1
	}
	if err := check("cuMemAlloc", C.k_cuMemAlloc_v2(b.ctx, &p, C.size_t(n))); err != nil {
		return 0, fmt.Errorf("cuda: allocating %d bytes on GPU %d (%d MiB free): %w", n, b.device, b.deviceFree()>>20, err)
	}
	return p, nil
}

// Alloc returns an uninitialised tensor; it panics when the device is out
// of memory (the interface has no error here; size caches from FreeMemory).
func (b *Backend) Alloc(dt backend.DType, shape ...int) backend.Tensor {
	t := &tensor{dt: dt, shape: append([]int(nil), shape...)}
	p, err := b.malloc(t.bytes())
	if err != nil {
		panic(err)
	}
	t.ptr = p
	return t
}

// Load uploads a weight tensor; quantized data (dt.Bytes(shape...) bytes
// of blocks in the interchange layout, shape [rows, cols] or [E, rows,
// cols]) is stored in the device layout (qlayout.go).
func (b *Backend) Load(dt backend.DType, shape []int, data []byte) (backend.Tensor, error) {
	t := &tensor{dt: dt, shape: append([]int(nil), shape...)}
	if dt.Quantized() {
		if len(shape) == 0 {
			return nil, fmt.Errorf("cuda: load %v%v: a quantized tensor needs a row dimension", dt, shape)
		}
		if err := dt.CheckCols(t.qcols()); err != nil {
			return nil, fmt.Errorf("cuda: load %v%v: %w", dt, shape, err)
		}
		if want := dt.Bytes(shape...); len(data) != want {
			return nil, fmt.Errorf("cuda: load %v%v: %d bytes, want %d", dt, shape, len(data), want)
		}
		if dt == backend.FP8 && b.fp8Min > 0 {
			if err := b.loadTileScales(t, data); err != nil {
				return nil, err
			}
		}
		data = qPack(dt, data, t.qrows(), t.qcols())
	}
	if len(data) != t.bytes() {
		return nil, fmt.Errorf("cuda: load %v%v: %d bytes, want %d", dt, shape, len(data), t.bytes())
	}
	p, err := b.malloc(t.bytes())
	if err != nil {
		return nil, err
	}
	t.ptr = p
	if len(data) > 0 {
		if err := check("cuMemcpyHtoD", C.k_cuMemcpyHtoDAsync_v2(b.ctx, p, unsafe.Pointer(&data[0]), C.size_t(len(data)), b.stream)); err != nil {
			return nil, err
		}
	}
	// Pageable copies are staged before the call returns, but surface
	// errors (and keep data alive) by waiting here: loading is not hot.
	if err := b.Sync(); err != nil {
		return nil, err
	}
	return t, nil
}

// Write copies host data into t, ordered after queued work (a quantized
// tensor takes the interchange layout, as Load).
func (b *Backend) Write(t backend.Tensor, data []byte) {
	tt := asT(t)
	if tt.dt.Quantized() {
		if want := tt.dt.Bytes(tt.shape...); len(data) != want {
			panic(fmt.Sprintf("cuda: write %d bytes into %v, want %d", len(data), tt, want))
		}
		if tt.fp8t != 0 {
			b.writeTileScales(tt, data)
		}
		data = qPack(tt.dt, data, tt.qrows(), tt.qcols())
	}
	if len(data) != tt.bytes() {
		panic(fmt.Sprintf("cuda: write %d bytes into %v", len(data), tt))
	}
	if len(data) == 0 {
		return
	}
	b.fail(check("cuMemcpyHtoD", C.k_cuMemcpyHtoDAsync_v2(b.ctx, tt.ptr, unsafe.Pointer(&data[0]), C.size_t(len(data)), b.stream)))
}

func (b *Backend) staging(n int) unsafe.Pointer {
	if n > b.pinnedSize {
		if b.pinned != nil {
			C.k_cuMemFreeHost(b.ctx, b.pinned)
			b.pinned, b.pinnedSize = nil, 0
		}
		sz := max(n, 1<<20)
		if err := check("cuMemAllocHost", C.k_cuMemAllocHost_v2(b.ctx, &b.pinned, C.size_t(sz))); err != nil {
			panic(err)
		}
		b.pinnedSize = sz
	}
	return b.pinned
}

type hostBuf struct {
	p unsafe.Pointer
	n int
}

// HostBuffer returns n bytes of page-locked host memory (see
// backend.HostMemory): a 133 MB restore staged through pageable memory
// crossed the bus at 2.6 GB/s on an H200, most of it the host's copy.
func (b *Backend) HostBuffer(n int) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("cuda: host buffer of %d bytes", n)
	}
	var p unsafe.Pointer
	if err := check("cuMemAllocHost", C.k_cuMemAllocHost_v2(b.ctx, &p, C.size_t(n))); err != nil {
		return nil, err
	}
	b.hostBufs = append(b.hostBufs, hostBuf{p, n})
	return unsafe.Slice((*byte)(p), n), nil
}

// pageLocked reports whether host lies inside a buffer HostBuffer gave out.
func (b *Backend) pageLocked(host []byte) bool {
	if len(host) == 0 {
		return false
	}
	lo := uintptr(unsafe.Pointer(&host[0]))
	for _, h := range b.hostBufs {
		if start := uintptr(h.p); lo >= start && lo+uintptr(len(host)) <= start+uintptr(h.n) {
			return true
		}
	}
	return false
}

// Read waits for queued work and copies t to host memory (a quantized
// tensor in the interchange layout).
func (b *Backend) Read(t backend.Tensor, dst []byte) error {
	tt := asT(t)
	if tt.dt.Quantized() {
		if want := tt.dt.Bytes(tt.shape...); len(dst) != want {
			return fmt.Errorf("cuda: read %v into %d bytes, want %d", tt, len(dst), want)
		}
		dev := make([]byte, tt.bytes())
		if err := b.Read(&tensor{dt: backend.I32, shape: []int{len(dev) / 4}, ptr: tt.ptr, view: true}, dev); err != nil {
			return err
		}
		copy(dst, qUnpack(tt.dt, dev, tt.qrows(), tt.qcols()))
		return nil
	}
	if len(dst) != tt.bytes() {
		return fmt.Errorf("cuda: read %v into %d bytes", tt, len(dst))
	}
	if b.capture {
		panic("cuda: Read inside Graph")
	}
	if len(dst) == 0 {
		return b.Sync()
	}
	p := b.staging(len(dst))
	if err := check("cuMemcpyDtoH", C.k_cuMemcpyDtoHAsync_v2(b.ctx, p, tt.ptr, C.size_t(len(dst)), b.stream)); err != nil {
		b.fail(err)
	}
	if err := b.Sync(); err != nil {
		return err
	}
	copy(dst, unsafe.Slice((*byte)(p), len(dst)))
	return nil
}

// Rows returns a view of rows [start, start+n) of t's first dimension.
func (b *Backend) Rows(t backend.Tensor, start, n int) backend.Tensor {
	tt := asT(t)
	if len(tt.shape) == 0 || start < 0 || n < 0 || start+n > tt.shape[0] {
		panic(fmt.Sprintf("cuda: rows [%d, %d) of %v", start, start+n, tt))
	}
	shape := append([]int{n}, tt.shape[1:]...)
	if tt.dt.Quantized() {
		if len(tt.shape) < 2 {
			panic(fmt.Sprintf("cuda: rows [%d, %d) of %v: a view of a quantized tensor takes whole rows", start, start+n, tt))
		}
		per := shapeSize(tt.shape[1 : len(tt.shape)-1]) // device rows a slice of the first dimension
		v := &tensor{dt: tt.dt, shape: shape, ptr: tt.ptr + devptr(start*per*tt.rb()), view: true}
		if tt.fp8t != 0 && start*per%128 == 0 {
			v.fp8t = tt.fp8t + devptr(start*per/128*fp8TileStride(tt.qcols())*4)
		}
		return v
	}
	return &tensor{dt: tt.dt, shape: shape, ptr: tt.ptr + devptr(start*tt.cols()*tt.dt.Size()), view: true}
}

// Reshape returns a view of t with another shape of the same size.
func (b *Backend) Reshape(t backend.Tensor, shape ...int) backend.Tensor {
	tt := asT(t)
	if shapeSize(shape) != tt.numel() {
		panic(fmt.Sprintf("cuda: reshape %v to %v", tt, shape))
	}
	if tt.dt.Quantized() && (len(shape) == 0 || shape[len(shape)-1] != tt.qcols()) {
		panic(fmt.Sprintf("cuda: reshape %v to %v: a quantized tensor keeps its rows (innermost dimension)", tt, shape))
	}
	return &tensor{dt: tt.dt, shape: append([]int(nil), shape...), ptr: tt.ptr, view: true, fp8t: tt.fp8t}
}

// Free releases a tensor made by Alloc or Load. It waits for queued work,
// which may still read the tensor.
func (b *Backend) Free(t backend.Tensor) {
	tt := asT(t)
	if tt.view {
		panic("cuda: free of a view")
	}
	if tt.ptr == 0 {
		return
	}
	b.fail(b.Sync())
	b.fail(check("cuMemFree", C.k_cuMemFree_v2(b.ctx, tt.ptr)))
	tt.ptr = 0
	if tt.fp8t != 0 {
		b.fail(check("cuMemFree", C.k_cuMemFree_v2(b.ctx, tt.fp8t)))
		tt.fp8t = 0
	}
}

// Sync waits for queued work and returns its first error.
func (b *Backend) Sync() error {
	if b.capture {
		panic("cuda: Sync inside Graph")
	}
	b.fail(check("cuStreamSynchronize", C.k_cuStreamSynchronize(b.ctx, b.stream)))
	return b.err
}

// scratchF32 is a [rows, cols] f32 view of the scratch buffer name.
func (b *Backend) scratchF32(name string, rows, cols int) *tensor {
	return &tensor{dt: backend.F32, shape: []int{rows, cols}, ptr: b.scratchBuf(name, 4*rows*cols), view: true}
}

// zeroedScratch is scratchBuf for counters that kernels leave at zero
// (dn_recur's arrivals): a new buffer is zeroed once, in stream order (in
// a capture, each replay of that graph zeroes it again, harmlessly).
func (b *Backend) zeroedScratch(name string, n int) devptr {
	old := b.scratch[name]
	p := b.scratchBuf(name, n)
	if s := b.scratch[name]; s != old {
		b.fail(check("cuMemsetD32Async", C.k_cuMemsetD32Async(b.ctx, p, 0, C.size_t(s.bytes()/4), b.stream)))
	}
	return p
}

// scratchBuf returns a device buffer of at least n bytes kept under name.
// A buffer that must grow is replaced; the old one is kept alive because a
// captured graph may still point at it.
func (b *Backend) scratchBuf(name string, n int) devptr {
	s := b.scratch[name]
	if s != nil && s.bytes() >= n {
		return s.ptr
	}
	if s != nil {
		b.retired = append(b.retired, s.ptr)
	}
	sz := max(n, 1<<16)
	if s != nil {
		sz = max(n, 2*s.bytes())
	}
	p, err := b.malloc(sz)
	if err != nil {
		panic(err)
	}
	b.scratch[name] = &tensor{dt: backend.I32, shape: []int{sz / 4}, ptr: p}
	return p
}
