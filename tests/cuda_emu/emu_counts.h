/*
 * emu_counts.h — counters of the CUDA emulation (tests/cuda_emu) for tests
 * that check how often the host code calls something, not what it
 * computes: C linkage, so that plain C tests (test_step.c) can read them.
 * Every counter only grows, from process start, over all threads.
 */
#ifndef M6_EMU_COUNTS_H
#define M6_EMU_COUNTS_H

#ifdef __cplusplus
extern "C" {
#endif

/* cuBLASLt objects made (cublaslt_emu.cpp): matmul descriptors
 * (cublasLtMatmulDescCreate) and matrix layouts
 * (cublasLtMatrixLayoutCreate), successful calls only. */
long emu_lt_desc_creates(void);
long emu_lt_layout_creates(void);
/* GEMMs queued (cublasLtMatmul calls that succeeded). */
long emu_lt_matmuls(void);

/* Host waits (mock_cuda.cpp): calls that block the host until device work
 * is done: cudaStreamSynchronize, cudaEventSynchronize,
 * cudaDeviceSynchronize, the synchronous cudaMemcpy and cudaMemset, and
 * cudaFree / cudaFreeHost of a block (which wait for every stream). A call counts
 * once (cudaStreamSynchronize(0) is one wait, not two), whether or not
 * the work was already done. */
long emu_host_waits(void);

/* Operations the host queues one by one (mock_cuda.cpp): kernels, GEMMs,
 * copies and memsets put on a stream (or run on the legacy one), not
 * those a graph's launch queues; and CUDA graphs: captures begun
 * (cudaStreamBeginCapture) and launches (cudaGraphLaunch). */
long emu_stream_ops(void);
long emu_graph_captures(void);
long emu_graph_launches(void);

#ifdef __cplusplus
}
#endif

#endif /* M6_EMU_COUNTS_H */
