/*
 * cublaslt_load.h — which cuBLASLt kernels/cuda/cublaslt_load.c opens: the
 * soname of the cublasLt.h compiled against (CUBLAS_VER_MAJOR), found as
 * the dynamic linker would (the executable's rpath to the toolkit, then
 * the usual paths). A build may name another with -DCUBLASLT_SONAME=...
 * (the loader's test names one that does not exist).
 */
#ifndef M6_CUBLASLT_LOAD_H
#define M6_CUBLASLT_LOAD_H

#include <cublasLt.h>

#define CUBLASLT_STR_(x) #x
#define CUBLASLT_STR(x) CUBLASLT_STR_(x)
#ifndef CUBLASLT_SONAME
#define CUBLASLT_SONAME "libcublasLt.so." CUBLASLT_STR(CUBLAS_VER_MAJOR)
#endif

#endif /* M6_CUBLASLT_LOAD_H */
