-- 0010_nodes_gemm.sql — what multiplies on each node: its CPU engine's
-- GEMM library and the instruction set that library dispatches to, as
-- "LIBRARY ISA" ("onednn avx512_core_bf16"; kernels/cpu/gemm.c's
-- gemm_describe), sent in its NodeJoin and shown by `m6ctl nodes`. NULL
-- for rows written before this migration and for nodes that do not say
-- (an older m6d).
ALTER TABLE nodes ADD COLUMN gemm TEXT;
