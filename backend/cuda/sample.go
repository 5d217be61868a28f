//go:build cgo

package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/kiln-llm/kiln/backend"
)

// sampleArgs mirrors struct SampleArgs in kernels/sample.cu.
type sampleArgs struct {
	Temperature, TopP, MinP, Uniform         float32
	Presence, Frequency, Repetition          float32
	TopK, CntOff, CntN, BiasOff, BiasN, NTop int32
	WantLp                                   int32
}

// Sample draws one token per row of logits on the device; only the tokens and
// the requested log-probabilities are copied back.
func (b *Backend) Sample(logits backend.Tensor, params []backend.SampleParams) ([]backend.Sampled, error) {
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
		return nil, b.Sync()
	}
	hargs := make([]sampleArgs, R)
	var cnt []int32
	var bias []float32
	maxTop := 0
	for i, p := range params {
		if p.Temperature < 0 || math.IsNaN(float64(p.Temperature)) {
			return nil, fmt.Errorf("cuda: sample: invalid temperature %v", p.Temperature)
		}
		if p.Uniform < 0 || p.Uniform >= 1 {
			return nil, fmt.Errorf("cuda: sample: uniform draw %v outside [0, 1)", p.Uniform)
		}
		a := &hargs[i]
		a.Temperature, a.TopP, a.MinP, a.Uniform = p.Temperature, p.TopP, p.MinP, p.Uniform
		a.Presence, a.Frequency, a.Repetition = p.PresencePenalty, p.FrequencyPenalty, p.RepetitionPenalty
		a.TopK = int32(p.TopK)
		a.CntOff, a.CntN = int32(len(cnt)/2), int32(len(p.Counts))
		for _, c := range p.Counts {
			// The count and the prompt flag share an int: 2*count + prompt.
			cnt = append(cnt, c.Token, 2*max(c.Count, 0)+int32(boolInt(c.Prompt)))
		}
		a.BiasOff, a.BiasN = int32(len(bias)/2), int32(len(p.Bias))
		for _, x := range p.Bias {
			bias = append(bias, math.Float32frombits(uint32(x.Token)), x.Bias)
		}
		a.NTop = int32(min(p.TopLogprobs, V))
		a.WantLp = int32(boolInt(p.Logprob))
		maxTop = max(maxTop, int(a.NTop))
	}
	// One upload: args, counts, bias; one download: tokens, logprobs, tops.
	argBytes := R * int(unsafe.Sizeof(sampleArgs{}))
	in := argBytes + 4*len(cnt) + 4*len(bias)
	outN := 2*R + 2*R*max(maxTop, 1)
	dIn := b.scratchBuf("samplein", in)
	dOut := b.scratchBuf("sampleout", 4*outN)
	work := b.scratchBuf("samplework", 4*R*V)
	// Arguments go up from the front of the staging buffer, results come
	// back behind them: one synchronisation per call.
	inPad := (in + 15) &^ 15
	host := b.staging(inPad + 4*outN)
	hb := unsafe.Slice((*byte)(host), in)
	copy(hb, unsafe.Slice((*byte)(unsafe.Pointer(&hargs[0])), argBytes))
	if len(cnt) > 0 {
		copy(hb[argBytes:], unsafe.Slice((*byte)(unsafe.Pointer(&cnt[0])), 4*len(cnt)))
	}
	if len(bias) > 0 {
		copy(hb[argBytes+4*len(cnt):], unsafe.Slice((*byte)(unsafe.Pointer(&bias[0])), 4*len(bias)))
	}
	b.fail(check("cuMemcpyHtoDAsync", C.k_cuMemcpyHtoDAsync_v2(dIn, host, C.size_t(in), b.stream)))
	mt := max(maxTop, 1)
	outTok, outLp := dOut, dOut+devptr(4*R)
	topTok, topLp := dOut+devptr(8*R), dOut+devptr(8*R+4*R*mt)
	b.run("sample_rows", g1(R), 1024, 0, lt.ptr, V, dIn, dIn+devptr(argBytes), dIn+devptr(argBytes+4*len(cnt)),
		work, outTok, outLp, topTok, topLp, mt)
	resP := unsafe.Add(host, inPad)
	b.fail(check("cuMemcpyDtoHAsync", C.k_cuMemcpyDtoHAsync_v2(resP, dOut, C.size_t(4*outN), b.stream)))
	if err := b.Sync(); err != nil {
		return nil, err
	}
	res := unsafe.Slice((*int32)(resP), outN)
	resF := unsafe.Slice((*float32)(resP), outN)
	out := make([]backend.Sampled, R)
	for i, p := range params {
		out[i].Token = res[i]
		if p.Logprob || p.TopLogprobs > 0 {
			out[i].Logprob = resF[R+i]
		}
		for n := 0; n < int(hargs[i].NTop); n++ {
			out[i].Top = append(out[i].Top, backend.TokenLogprob{Token: res[2*R+i*mt+n], Logprob: resF[2*R+R*mt+i*mt+n]})
		}
	}
	return out, nil
}
