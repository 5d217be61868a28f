// ktrace: every kernel's start and end on the GPU, CUDA graphs' nodes
// included, as CUPTI's activity records give them: a timeline of a decode
// step with programmatic dependent launch, which Nsight Compute (a kernel
// at a time) cannot show and Nsight Systems is not there to show. An
// injection library: the driver loads it at cuInit when
// CUDA_INJECTION64_PATH names it, so kiln itself needs nothing. Built and
// run by scripts/ktrace/run.sh.
//
// Records go to $KILN_KTRACE (default /tmp/ktrace.csv) as lines
// "start_ns,end_ns,grid_x,grid_y,grid_z,block_x,name". A thread flushes CUPTI's
// buffers every 50 ms: a Go program leaves through exit_group, which
// runs no atexit handler.
#include <cupti.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

// KREC: the kernel record type of this CUPTI (run.sh tries 10, 9, 8).
#define KREC_(v) CUpti_ActivityKernel##v
#define KREC(v) KREC_(v)

static FILE *out;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
enum { BUF = 4 << 20 };

static void CUPTIAPI requested(uint8_t **buffer, size_t *size, size_t *max) {
	*buffer = aligned_alloc(8, BUF);
	*size = BUF;
	*max = 0;
}

static void CUPTIAPI completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
	CUpti_Activity *r = NULL;
	pthread_mutex_lock(&mu);
	while (cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
		if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
		KREC(KTRACE_KREC) *k = (KREC(KTRACE_KREC) *)r;
		fprintf(out, "%llu,%llu,%d,%d,%d,%d,%s\n", (unsigned long long)k->start, (unsigned long long)k->end, k->gridX, k->gridY, k->gridZ,
			k->blockX, k->name);
	}
	fflush(out);
	pthread_mutex_unlock(&mu);
	free(buffer);
}

static void *flusher(void *arg) {
	for (;;) {
		usleep(50000);
		cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
	}
	return NULL;
}

int InitializeInjection(void) {
	const char *path = getenv("KILN_KTRACE");
	out = fopen(path ? path : "/tmp/ktrace.csv", "w");
	if (!out) return 0;
	if (cuptiActivityRegisterCallbacks(requested, completed) != CUPTI_SUCCESS ||
		cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
		fprintf(stderr, "ktrace: CUPTI refused the kernel activity\n");
		return 0;
	}
	pthread_t t;
	pthread_create(&t, NULL, flusher, NULL);
	pthread_detach(t);
	return 1;
}
