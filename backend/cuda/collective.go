//go:build cgo

package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kiln-llm/kiln/backend"
)

// A group is the GPUs of one process that run one model split across them
// (docs/multigpu.md): a Backend a GPU, each with an NCCL communicator of
// the group. Outside a group a Backend is rank 0 of 1, whose collectives
// are copies.
type group struct {
	ranks   []*Backend
	aborted atomic.Bool
}

var _ backend.Collective = (*Backend)(nil)

var (
	ncclOnce sync.Once
	ncclErr  error
)

// loadNCCL opens libnccl once, with NVLink multicast (NVLS) off: on a
// shared host it can take every GPU of the host out of service, and kiln's
// all-reduces are small. NCCL's graph mixing support is off too (unless
// the environment sets it): it adds an event's record and wait to every
// collective a graph holds, which cost a decode step 5% at two ranks. Off,
// NCCL forbids a collective issued while a graph holding one of the same
// communicator is outstanding, so each rank has two (ncclCall).
func loadNCCL() error {
	ncclOnce.Do(func() {
		os.Setenv("NCCL_NVLS_ENABLE", "0")
		if _, set := os.LookupEnv("NCCL_GRAPH_MIXING_SUPPORT"); !set {
			os.Setenv("NCCL_GRAPH_MIXING_SUPPORT", "0")
		}
		ncclErr = loadErr(func(b *C.char, n C.int) C.int { return C.load_nccl(b, n) })
	})
	return ncclErr
}

// ncclCheck turns an NCCL result into an error naming the call.
func ncclCheck(call string, r C.int) error {
	if r == 0 {
		return nil
	}
	return fmt.Errorf("cuda: %s: %s (NCCL error %d)", call, C.GoString(C.k_ncclGetErrorString(r)), int(r))
}

// NewGroup opens the GPUs devices (ordinals, each once) as ranks 0 to
// len(devices)-1 of one group that runs a model split across them, joined
// by NCCL (libnccl.so.2, opened at run time like the driver).
func NewGroup(devices []int, opts Options) ([]*Backend, error) {
	if len(devices) == 0 {
		return nil, errors.New("cuda: a group of no GPUs")
	}
	for i, d := range devices {
		if slices.Index(devices, d) != i {
			return nil, fmt.Errorf("cuda: GPU %d named twice in %v", d, devices)
		}
	}
	n, err := deviceCount()
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, errors.New("cuda: no CUDA device")
	}
	for _, d := range devices {
		if d < 0 || d >= n {
			return nil, fmt.Errorf("cuda: GPU %d asked for; the driver sees %d (0 to %d)", d, n, n-1)
		}
	}
	if err := loadNCCL(); err != nil {
		return nil, fmt.Errorf("cuda: several GPUs need NCCL: %w", err)
	}
	g := &group{}
	for r, d := range devices {
		o := opts
		o.Device = d
		b, err := New(o)
		if err != nil {
			return nil, fmt.Errorf("cuda: GPU %d of the group: %w", d, err)
		}
		b.group, b.rank = g, r
		g.ranks = append(g.ranks, b)
	}
	eager, err := g.communicators()
	if err != nil {
		return nil, err
	}
	captured, err := g.communicators()
	if err != nil {
		return nil, err
	}
	for r, b := range g.ranks {
		b.comm, b.graphComm = eager[r], captured[r]
	}
	return g.ranks, nil
}

// communicators makes one NCCL communicator of the group's ranks, a
// handle a rank.
func (g *group) communicators() ([]C.ncclComm_t, error) {
	var id C.ncclUniqueId
	if err := ncclCheck("ncclGetUniqueId", C.k_ncclGetUniqueId(g.ranks[0].ctx, &id)); err != nil {
		return nil, err
	}
	// Each rank's init waits for the others': one goroutine a rank.
	n := len(g.ranks)
	comms, errs := make([]C.ncclComm_t, n), make([]error, n)
	var wg sync.WaitGroup
	for r, b := range g.ranks {
		wg.Go(func() {
			// A variable of its own: cgo checks the whole of a slice an
			// element of which it is given, while the other ranks write it.
			var c C.ncclComm_t
			errs[r] = ncclCheck("ncclCommInitRank", C.k_ncclCommInitRank(b.ctx, &c, C.int(n), id, C.int(r)))
			comms[r] = c
		})
	}
	wg.Wait()
	return comms, errors.Join(errs...)
}

// Rank is the backend's place in its group (0 outside one).
func (b *Backend) Rank() int { return b.rank }

// Ranks is the size of the backend's group (1 outside one).
func (b *Backend) Ranks() int {
	if b.group == nil {
		return 1
	}
	return len(b.group.ranks)
}

// ncclCall issues an NCCL call under the rank's lock, which Abort takes
// before it aborts the communicators (aborting one while another thread is
// inside a call on it is a race); once the group is aborted it panics with
// backend.ErrGroupAborted instead. The call gets graphComm while a graph
// is being captured, comm otherwise: with graph mixing support off (see
// loadNCCL), no communicator has a collective issued while a graph of
// its own is outstanding. The profile's time of a collective includes its
// wait for the other ranks.
func (b *Backend) ncclCall(name string, call func(comm C.ncclComm_t) C.int) {
	b.around(name, func() {
		b.ncclMu.Lock()
		defer b.ncclMu.Unlock()
		if b.group.aborted.Load() {
			panic(backend.ErrGroupAborted)
		}
		comm := b.comm
		if b.capture {
			comm = b.graphComm
		}
		b.fail(ncclCheck(name, call(comm)))
	})
}

// Partial zeroes the residual x on every rank but 0, whose residual it is,
// so that the ranks' shares of a block's output added to x sum to the
// residual plus the output; see backend.Collective.
func (b *Backend) Partial(x backend.Tensor) {
	xt := asT(x)
	backend.CheckCollective("cuda: partial", x)
	if b.rank != 0 {
		n := backend.Numel(xt)
		zeroF32Kernel.runOverlapped(b, g1(b.blocksFor(n)), 256, 0, zeroF32Args{x: xt.ptr, n: int64(n)})
	}
}

// AllReduce sums x over the group's ranks in place (NCCL's all-reduce, on
// the backend's stream, so a graph captures it); see backend.Collective.
func (b *Backend) AllReduce(x backend.Tensor) {
	xt := asT(x)
	backend.CheckCollective("cuda: all-reduce", x)
	if b.group == nil {
		return
	}
	b.ncclCall("ncclAllReduce", func(comm C.ncclComm_t) C.int {
		return C.k_ncclAllReduce(b.ctx, xt.ptr, xt.ptr, C.size_t(backend.Numel(xt)), C.NCCL_FLOAT32, C.NCCL_SUM, comm, b.stream)
	})
}

// EmbedShare writes the embeddings of the step's tokens that the rank's
// share of the table holds, zeros for the others; see backend.Collective.
func (b *Backend) EmbedShare(out, table backend.Tensor, first int) { b.embed(out, table, first, true) }

// GatherCols joins the ranks' column blocks: NCCL's all-gather puts them
// one after the other, then each becomes its columns of out; see
// backend.Collective.
func (b *Backend) GatherCols(out, x backend.Tensor) {
	ot, xt := asT(out), asT(x)
	R, W, n := xt.rows(), xt.cols(), b.Ranks()
	if ot.dt != backend.F32 || xt.dt != backend.F32 || ot.rows() != R || ot.cols() != n*W {
		panic(fmt.Sprintf("cuda: gather cols: %v into %v", xt, ot))
	}
	if b.group == nil {
		b.copyDtoD(ot.ptr, xt.ptr, ot.bytes())
		return
	}
	all := b.scratchF32("gather cols", n*R, W)
	b.ncclCall("ncclAllGather", func(comm C.ncclComm_t) C.int {
		return C.k_ncclAllGather(b.ctx, xt.ptr, all.ptr, C.size_t(R*W), C.NCCL_FLOAT32, comm, b.stream)
	})
	for r := range n {
		part := &tensor{dt: backend.F32, shape: []int{R, W}, ptr: all.ptr + devptr(4*r*R*W), view: true}
		b.copyCols(ot, r*W, part, 0, W)
	}
}

// Abort ends the group: every rank's communicators are aborted (which ends
// the NCCL kernels a rank waits in), and every later collective panics
// with backend.ErrGroupAborted; see backend.Collective. A rank inside an
// NCCL call is let finish it first (ncclCall's lock), unless it stays
// there (waiting in it for the rank that failed): its communicator is then
// aborted under it, which is what ncclCommAbort is for.
func (b *Backend) Abort() {
	g := b.group
	if g == nil || g.aborted.Swap(true) {
		return
	}
	for _, r := range g.ranks {
		locked := r.ncclMu.TryLock()
		for wait := time.Now().Add(abortWait); !locked && time.Now().Before(wait); locked = r.ncclMu.TryLock() {
			time.Sleep(time.Millisecond)
		}
		C.k_ncclCommAbort(r.ctx, r.comm)
		C.k_ncclCommAbort(r.ctx, r.graphComm)
		if locked {
			r.ncclMu.Unlock()
		}
	}
}

// abortWait is how long Abort lets a rank's NCCL call finish before it
// aborts the communicator under it: an enqueue takes microseconds; a call
// still there after this waits for a peer that will not come.
const abortWait = 2 * time.Second

// groupFree is the least device memory free on any GPU of b's group, which
// all hold the same shares: what each of them can still give.
func (b *Backend) groupFree() int64 {
	free := b.deviceFree()
	if b.group != nil {
		for _, r := range b.group.ranks {
			free = min(free, r.deviceFree())
		}
	}
	return free
}

// deviceCount is how many GPUs the driver sees.
func deviceCount() (int, error) {
	if err := loadDriver(); err != nil {
		return 0, fmt.Errorf("cuda: no driver: %w", err)
	}
	if err := check("cuInit", C.k_cuInit(nil, 0)); err != nil {
		return 0, err
	}
	var n C.int
	err := check("cuDeviceGetCount", C.k_cuDeviceGetCount(nil, &n))
	return int(n), err
}
