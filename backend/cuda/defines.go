//go:build cgo

package cuda

import "github.com/kiln-llm/kiln/backend"

//go:generate go test -run TestKernelDefines -update

// kernelDefines are the constants the kernels share with the Go side, each
// defined once, in Go: kernels/defines.cuh, which every kernel file has in
// front (kernelSources), is generated from this list, and
// TestKernelDefines fails when it is stale or when a kernel file defines
// one of these names itself.
var kernelDefines = []struct {
	doc   string // a comment that starts a group
	name  string
	value int
}{
	{"Element types, as backend.DType numbers them.", "DT_F32", int(backend.F32)},
	{"", "DT_BF16", int(backend.BF16)},
	{"", "DT_F16", int(backend.F16)},
	{"The skinny GEMM (skinny.cu): SK_BM weight rows by SK_BK columns a stage, rows\n// SK_P elements apart in shared memory, SK_STAGES stages, up to SK_TOK tokens.", "SK_BM", skinnyRows},
	{"", "SK_BK", skinnyCols},
	{"", "SK_P", skinnyPitch},
	{"", "SK_STAGES", skinnyStages},
	{"", "SK_TOK", skinnyMaxTokens},
	{"The FP8 skinny GEMM (skinny.cu, SkFp8): F8_BK columns a stage, F8_SMEM_n bytes of\n// shared memory a block of the kernels of up to n tokens.", "F8_BK", fp8SkinnyCols},
	{"", "F8_SMEM_8", fp8SkinnySmem(skinnyMaxTokens)},
	{"", "F8_SMEM_2", fp8SkinnySmem(2)},
	{"The grouped expert products (moe_mm.cuh): tiles of MG_BN outputs, MG_BK columns\n// a stage, MG_STAGES stages, rows MG_P elements apart in shared memory; MG_RAW\n// bytes of a quantized unit's blocks (quant.cu, QTiles).", "MG_BN", moeGroupOuts},
	{"", "MG_BK", moeGroupCols},
	{"", "MG_STAGES", moeGroupStages},
	{"", "MG_P", moeGroupPitch},
	{"", "MG_RAW", moeGroupRaw},
	{"The grouped expert products on wgmma (moe_wg.cu): tiles of MW_BN outputs,\n// MW_STAGES stages of 128 bytes of a row.", "MW_BN", moeWGOuts},
	{"", "MW_STAGES", moeWGStages},
	{"The FP8 decode products on wgmma (f8wg.cu): F8WG_STAGES stages of 128 columns.", "F8WG_STAGES", f8wgStages},
	{"The warps a multiprocessor runs of qgemv (quant.cu), the most a block has.", "QGEMV_MAXW", qgemvWarpsSM},
	{"The sampler (sample.cu): ROW_CHUNK logits a block of argmax_rows, sample_scan and\n// sample_gather; a histogram of the keys' top SAMPLE_BITS bits; up to SAMPLE_CAP\n// candidates a row; a row's plan of SAMPLE_PLAN_BYTES.", "ROW_CHUNK", rowChunk},
	{"", "SAMPLE_BITS", sampleBits},
	{"", "SAMPLE_CAP", sampleCap},
	{"", "SAMPLE_PLAN_BYTES", samplePlanBytes},
	{"The rows a block of moe_count and moe_scatter takes (moe.cu), a thread each.", "MOE_GROUP_ROWS", moeGroupBlockRows},
	{"The tokens of a chunk of the chunked DeltaNet kernels (deltanet_chunk.cu).", "DN_C", dnChunkLen},
	{"The DeltaNet convs (deltanet.cu): up to DN_CONV_MAXK taps; dn_conv's threads take\n// runs of DN_CONV_RUN tokens.", "DN_CONV_MAXK", dnConvMaxK},
	{"", "DN_CONV_RUN", dnConvRun},
	{"The token-by-token delta rule (deltanet.cu, dn_recur): each thread holds DR_ROWS\n// rows of a state column (four warps: key dims up to 4 * DR_ROWS).", "DR_ROWS", dnRecurRows},
	{"The tensor-core decode attention (flash.cu): tiles of DM_BK keys.", "DM_BK", decodeMMAKeys},
	{"The fewest keys a split of the decode attention takes: DS_MMA on tensor cores,\n// DS_SCALAR in the scalar kernel.", "DS_MMA", decodeSplitMMA},
	{"", "DS_SCALAR", decodeSplitScalar},
	{"The scalar prefill attention (attention.cu): AP_BQ queries a block, tiles of\n// AP_BK keys.", "AP_BQ", attnPrefillQueries},
	{"", "AP_BK", attnPrefillKeys},
}
