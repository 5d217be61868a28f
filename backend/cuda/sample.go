//go:build cgo

package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
	mathbits "math/bits"
	"unsafe"

	"github.com/kiln-llm/kiln/backend"
)

// sampleArgs is struct SampleArgs of kernels/sample.cu, one a row
// (TestKernelSignatures compares the two).
type sampleArgs struct {
	temperature, topP, minP, uniform         float32
	presence, frequency, repetition          float32
	topK, cntOff, cntN, biasOff, biasN, nTop int32
	wantLp, maskOff                          int32
}

var (
	sampleScanKernel   = newKernel[sampleScanArgs]("sample_scan")
	sampleGatherKernel = newKernel[sampleGatherArgs]("sample_gather")
	sampleRowsKernel   = newKernel[sampleRowsArgs]("sample_rows")
	argmaxRowsKernel   = newKernel[argmaxRowsArgs]("argmax_rows")
)

const (
	// rowChunk is the logits a block of argmax_rows, sample_scan and
	// sample_gather reads: 75 blocks for a row of 151,936.
	rowChunk = 2048
	// sampleBits: sample_scan counts the keys' top bits in a histogram of
	// 1 << sampleBits bins, whose top bins give up to sampleCap candidates
	// a row (two for each of sample_rows' 1024 threads).
	sampleBits = 12
	sampleCap  = 2048
	// samplePlanBytes is the size of struct SamplePlan.
	samplePlanBytes = 32
)

type argmaxRowsArgs struct {
	logits          devptr
	V               int32
	partV, partI    devptr
	arrived, outTok devptr
}

type sampleScanArgs struct {
	logits                devptr
	V                     int32
	args, cnt, bias, mask devptr
	work, hist, part      devptr
	arrived, plan         devptr
}

type sampleGatherArgs struct {
	logits     devptr
	V          int32
	args, work devptr
	plan, keys devptr
}

type sampleRowsArgs struct {
	logits                 devptr
	V                      int32
	args, work, plan, keys devptr
	outTok, outLp          devptr
	topTok, topLp          devptr
	maxTop                 int32
}

// Sample draws one token per row of logits on the device; only the tokens and
// the requested log-probabilities are copied back.
func (b *Backend) Sample(logits backend.Tensor, params []backend.SampleParams) ([]backend.Sampled, error) {
	wait, err := b.SampleStart(logits, params)
	if err != nil {
		return nil, err
	}
	return wait()
}

// sampling is one of the host buffers of SampleStart: arguments at the
// front, results behind them; done follows their download, and gen counts
// the samplings that used it.
type sampling struct {
	host unsafe.Pointer
	size int
	done C.CUevent
	gen  int
}

// SampleStart queues Sample's upload, kernel and download; its wait
// waits for the download alone.
func (b *Backend) SampleStart(logits backend.Tensor, params []backend.SampleParams) (func() ([]backend.Sampled, error), error) {
	lt := asT(logits)
	R, V := lt.rows(), lt.cols()
	checkF32("sample", lt)
	if len(params) != R {
		panic(fmt.Sprintf("cuda: sample: %d params for %d rows", len(params), R))
	}
	if b.capture {
		panic("cuda: Sample inside Graph")
	}
	if R == 0 {
		b.sampledRows = 0
		return func() ([]backend.Sampled, error) { return nil, b.Sync() }, nil
	}
	hargs := make([]sampleArgs, R)
	var cnt []int32
	var bias []float32
	var mask []uint64
	maxTop := 0
	for i, p := range params {
		if p.Temperature < 0 || math.IsNaN(float64(p.Temperature)) {
			return nil, fmt.Errorf("cuda: sample: invalid temperature %v", p.Temperature)
		}
		if p.Uniform < 0 || p.Uniform >= 1 {
			return nil, fmt.Errorf("cuda: sample: uniform draw %v outside [0, 1)", p.Uniform)
		}
		a := &hargs[i]
		a.temperature, a.topP, a.minP, a.uniform = p.Temperature, p.TopP, p.MinP, p.Uniform
		a.presence, a.frequency, a.repetition = p.PresencePenalty, p.FrequencyPenalty, p.RepetitionPenalty
		a.topK = int32(min(p.TopK, V)) // a top_k over the vocabulary limits nothing; int32 would wrap
		a.cntOff = int32(len(cnt) / 2)
		if p.Penalized() { // else the counts change nothing, and would cost sample_rows a copy of the row
			a.cntN = int32(len(p.Counts))
			for _, c := range p.Counts {
				// The count and the prompt flag share an int: 2*count + prompt.
				cnt = append(cnt, c.Token, 2*max(c.Count, 0)+int32(boolInt(c.Prompt)))
			}
		}
		a.biasOff, a.biasN = int32(len(bias)/2), int32(len(p.Bias))
		for _, x := range p.Bias {
			bias = append(bias, math.Float32frombits(uint32(x.Token)), x.Bias)
		}
		a.nTop = int32(min(p.TopLogprobs, V))
		a.maskOff = -1
		if p.Mask != nil {
			n, err := maskAllows(p.Mask, V)
			if err != nil {
				return nil, fmt.Errorf("cuda: sample row %d: %w", i, err)
			}
			a.maskOff = int32(len(mask))
			mask = append(mask, p.Mask...)
			a.nTop = min(a.nTop, int32(n)) // only allowed tokens are listed
		}
		a.wantLp = boolInt(p.Logprob)
		maxTop = max(maxTop, int(a.nTop))
	}
	// One upload: args, masks (8-byte aligned), counts, bias; one download:
	// tokens, logprobs, tops.
	argBytes := R * int(unsafe.Sizeof(sampleArgs{}))
	maskAt := (argBytes + 7) &^ 7
	cntAt := maskAt + 8*len(mask)
	biasAt := cntAt + 4*len(cnt)
	in := biasAt + 4*len(bias)
	outN := 2*R + 2*R*max(maxTop, 1)
	dIn := b.scratchBuf("samplein", in)
	dOut := b.scratchBuf("sampleout", 4*outN)
	// Arguments go up from the front of the host buffer, results come
	// back behind them: one synchronisation per call. The buffer's last
	// sampling may still be on its way, if its wait was not called.
	inPad := (in + 15) &^ 15
	sm := &b.samplings[b.nextSample]
	b.nextSample ^= 1
	if err := check("cuEventSynchronize", C.k_cuEventSynchronize(b.ctx, sm.done)); err != nil {
		return nil, err
	}
	if sm.size < inPad+4*outN {
		if sm.host != nil {
			C.k_cuMemFreeHost(b.ctx, sm.host)
			sm.host, sm.size = nil, 0
		}
		sz := max(inPad+4*outN, 64<<10)
		if err := check("cuMemAllocHost", C.k_cuMemAllocHost_v2(b.ctx, &sm.host, C.size_t(sz))); err != nil {
			return nil, err
		}
		sm.size = sz
	}
	sm.gen++
	gen, host := sm.gen, sm.host
	hb := unsafe.Slice((*byte)(host), in)
	copy(hb, unsafe.Slice((*byte)(unsafe.Pointer(&hargs[0])), argBytes))
	if len(mask) > 0 {
		copy(hb[maskAt:], unsafe.Slice((*byte)(unsafe.Pointer(&mask[0])), 8*len(mask)))
	}
	if len(cnt) > 0 {
		copy(hb[cntAt:], unsafe.Slice((*byte)(unsafe.Pointer(&cnt[0])), 4*len(cnt)))
	}
	if len(bias) > 0 {
		copy(hb[biasAt:], unsafe.Slice((*byte)(unsafe.Pointer(&bias[0])), 4*len(bias)))
	}
	mt := max(maxTop, 1)
	outTok, outLp := dOut, dOut+devptr(4*R)
	topTok, topLp := dOut+devptr(8*R), dOut+devptr(8*R+4*R*mt)
	nc := (V + rowChunk - 1) / rowChunk
	if argmaxOnly(hargs) && b.argmax {
		part := b.scratchBuf("argmaxpart", 8*R*nc)
		argmaxRowsKernel.run(b, [3]int{nc, R, 1}, 256, 0, argmaxRowsArgs{logits: lt.ptr, V: int32(V), partV: part, partI: part + devptr(4*R*nc),
			arrived: b.zeroedScratch("argmaxarrived", 4*R), outTok: outTok})
	} else {
		b.fail(check("cuMemcpyHtoDAsync", C.k_cuMemcpyHtoDAsync_v2(b.ctx, dIn, host, C.size_t(in), b.stream)))
		work := b.scratchBuf("samplework", 4*R*V)
		plan := b.scratchBuf("sampleplan", samplePlanBytes*R)
		keys := b.scratchBuf("samplekeys", 8*sampleCap*R)
		sampleScanKernel.run(b, [3]int{nc, R, 1}, 256, 0, sampleScanArgs{logits: lt.ptr, V: int32(V), args: dIn, cnt: dIn + devptr(cntAt),
			bias: dIn + devptr(biasAt), mask: dIn + devptr(maskAt), work: work, hist: b.zeroedScratch("samplehist", 4*R<<sampleBits),
			part: b.scratchBuf("samplepart", 16*R*nc), arrived: b.zeroedScratch("samplearrived", 4*R), plan: plan})
		sampleGatherKernel.run(b, [3]int{nc, R, 1}, 256, 0, sampleGatherArgs{logits: lt.ptr, V: int32(V), args: dIn, work: work, plan: plan, keys: keys})
		sampleRowsKernel.run(b, g1(R), 1024, 0, sampleRowsArgs{logits: lt.ptr, V: int32(V), args: dIn, work: work, plan: plan, keys: keys,
			outTok: outTok, outLp: outLp, topTok: topTok, topLp: topLp, maxTop: int32(mt)})
	}
	b.sampled, b.sampledRows = outTok, R
	resP := unsafe.Add(host, inPad)
	b.fail(check("cuMemcpyDtoHAsync", C.k_cuMemcpyDtoHAsync_v2(b.ctx, resP, dOut, C.size_t(4*outN), b.stream)))
	b.fail(check("cuEventRecord", C.k_cuEventRecord(b.ctx, sm.done, b.stream)))
	return func() ([]backend.Sampled, error) {
		if sm.gen != gen {
			return nil, errors.New("cuda: sample: a third sampling was started before this one's wait")
		}
		b.fail(check("cuEventSynchronize", C.k_cuEventSynchronize(b.ctx, sm.done)))
		if b.err != nil {
			return nil, b.err
		}
		return readSampled(unsafe.Slice((*int32)(resP), outN), params, hargs, mt), nil
	}, nil
}

// argmaxOnly reports whether every row asks only for its largest logit,
// which argmax_rows finds over many blocks.
func argmaxOnly(args []sampleArgs) bool {
	for _, a := range args {
		if a.temperature > 0 || a.cntN > 0 || a.biasN > 0 || a.maskOff >= 0 || a.wantLp != 0 || a.nTop > 0 {
			return false
		}
	}
	return true
}

// readSampled reads the samplers' results res: R tokens, R log-probabilities,
// then each row's mt top tokens and their log-probabilities.
func readSampled(res []int32, params []backend.SampleParams, hargs []sampleArgs, mt int) []backend.Sampled {
	R := len(params)
	resF := unsafe.Slice((*float32)(unsafe.Pointer(&res[0])), len(res))
	out := make([]backend.Sampled, R)
	for i, p := range params {
		out[i].Token = res[i]
		if p.Logprob || p.TopLogprobs > 0 {
			out[i].Logprob = resF[R+i]
		}
		for n := 0; n < int(hargs[i].nTop); n++ {
			out[i].Top = append(out[i].Top, backend.TokenLogprob{Token: res[2*R+i*mt+n], Logprob: resF[2*R+R*mt+i*mt+n]})
		}
	}
	return out
}

// maskAllows checks a token mask's length against the vocabulary and
// returns how many tokens it allows (at least one).
func maskAllows(mask []uint64, V int) (int, error) {
	if len(mask) != backend.MaskWords(V) {
		return 0, fmt.Errorf("token mask of %d words for a vocabulary of %d", len(mask), V)
	}
	n := 0
	for w, bits := range mask {
		if rest := V - 64*w; rest < 64 {
			bits &= 1<<rest - 1
		}
		n += mathbits.OnesCount64(bits)
	}
	if n == 0 {
		return 0, fmt.Errorf("the token mask allows no token")
	}
	return n, nil
}
