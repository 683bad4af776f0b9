-- 0002_offload_metrics.sql — per-step offloading figures (issue #5): slot
-- placement, peak device memory, host<->device rate and the share of copy
-- time hidden behind compute. Same names and units as m6.proto's MetricRow.
-- Rows written before this migration keep NULL (not recorded).

ALTER TABLE metrics ADD COLUMN resident_slots INTEGER;       -- slots on the device
ALTER TABLE metrics ADD COLUMN offloaded_slots INTEGER;      -- slots in host memory
ALTER TABLE metrics ADD COLUMN peak_device_bytes INTEGER;    -- since the trainer started
ALTER TABLE metrics ADD COLUMN h2d_gbps REAL;                -- this step; NULL: no copies
ALTER TABLE metrics ADD COLUMN d2h_gbps REAL;                -- this step; NULL: no copies
ALTER TABLE metrics ADD COLUMN copy_hidden_fraction REAL;    -- 0..1; NULL: no copies
