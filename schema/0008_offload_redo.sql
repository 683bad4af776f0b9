-- 0008_offload_redo.sql — the speculative clipped host AdamW of offloaded
-- slots (offload.speculative, issue 19): per step 1 when the step's
-- speculative update was redone (its global norm exceeded grad_clip), 0
-- when it was kept; NULL when the step did not speculate (no offloaded
-- slots, no clipping, speculation off) and in rows written before this
-- migration. SUM over a run's rows is its redo count. Same name as
-- m6.proto's MetricRow.offload_redo_steps.

ALTER TABLE metrics ADD COLUMN offload_redo_steps INTEGER;
