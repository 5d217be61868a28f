// The constants the kernels share with the Go side, generated from
// kernelDefines (backend/cuda/defines.go) by go generate: do not edit.

// Element types, as backend.DType numbers them.
#define DT_F32 0
#define DT_BF16 1
#define DT_F16 2

// The skinny GEMM (skinny.cu): SK_BM weight rows by SK_BK columns a stage, rows
// SK_P elements apart in shared memory, SK_STAGES stages, up to SK_TOK tokens.
#define SK_BM 32
#define SK_BK 256
#define SK_P 264
#define SK_STAGES 3
#define SK_TOK 8

// The FP8 skinny GEMM (skinny.cu, SkFp8): F8_BK columns a stage, F8_SMEM_n bytes of
// shared memory a block of the kernels of up to n tokens.
#define F8_BK 512
#define F8_SMEM_8 85760
#define F8_SMEM_2 60608

// The grouped expert products (moe_mm.cuh): tiles of MG_BN outputs, MG_BK columns
// a stage, MG_STAGES stages, rows MG_P elements apart in shared memory; MG_RAW
// bytes of a quantized unit's blocks (quant.cu, QTiles).
#define MG_BN 128
#define MG_BK 32
#define MG_STAGES 3
#define MG_P 40
#define MG_RAW 80

// The grouped expert products on wgmma (moe_wg.cu): tiles of MW_BN outputs,
// MW_STAGES stages of 128 bytes of a row.
#define MW_BN 128
#define MW_STAGES 4

// The FP8 decode products on wgmma (f8wg.cu): F8WG_STAGES stages of 128 columns.
#define F8WG_STAGES 6

// The warps a multiprocessor runs of qgemv (quant.cu), the most a block has.
#define QGEMV_MAXW 24

// The sampler (sample.cu): ROW_CHUNK logits a block of argmax_rows, sample_scan and
// sample_gather; a histogram of the keys' top SAMPLE_BITS bits; up to SAMPLE_CAP
// candidates a row; a row's plan of SAMPLE_PLAN_BYTES.
#define ROW_CHUNK 2048
#define SAMPLE_BITS 12
#define SAMPLE_CAP 2048
#define SAMPLE_PLAN_BYTES 32

// The rows a block of moe_count and moe_scatter takes (moe.cu), a thread each.
#define MOE_GROUP_ROWS 1024

// The tokens of a chunk of the chunked DeltaNet kernels (deltanet_chunk.cu).
#define DN_C 64

// The DeltaNet convs (deltanet.cu): up to DN_CONV_MAXK taps; dn_conv's threads take
// runs of DN_CONV_RUN tokens.
#define DN_CONV_MAXK 8
#define DN_CONV_RUN 32

// The token-by-token delta rule (deltanet.cu, dn_recur): each thread holds DR_ROWS
// rows of a state column (four warps: key dims up to 4 * DR_ROWS).
#define DR_ROWS 32

// The tensor-core decode attention (flash.cu): tiles of DM_BK keys.
#define DM_BK 64

// The fewest keys a split of the decode attention takes: DS_MMA on tensor cores,
// DS_SCALAR in the scalar kernel.
#define DS_MMA 64
#define DS_SCALAR 16

// The scalar prefill attention (attention.cu): AP_BQ queries a block, tiles of
// AP_BK keys.
#define AP_BQ 32
#define AP_BK 32
