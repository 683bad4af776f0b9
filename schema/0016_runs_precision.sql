-- 0016_runs_precision.sql — the arithmetic a run trains in, beside the
-- summary of 0009 and the layout of 0015: precision (the GEMMs' inputs,
-- spec_precision: device.precision on cpu, bf16 on cuda) and
-- master_precision (optimizer.master), "fp32" or "bf16", stored at
-- submit. Rows from before this migration keep NULL: the daemon reads
-- both from the row's spec.
ALTER TABLE runs ADD COLUMN precision TEXT;
ALTER TABLE runs ADD COLUMN master_precision TEXT;
