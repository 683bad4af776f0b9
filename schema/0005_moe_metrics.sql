-- 0005_moe_metrics.sql — per-step MoE router figures (issue #13), over the
-- step's microbatches and MoE blocks. NULL for a dense model and for rows
-- written before this migration. Same names and units as m6.proto's
-- MetricRow.

ALTER TABLE metrics ADD COLUMN moe_aux_loss REAL;          -- balancing loss, before its coefficient
ALTER TABLE metrics ADD COLUMN moe_z_loss REAL;            -- router z-loss, before its coefficient
ALTER TABLE metrics ADD COLUMN moe_dropped_fraction REAL;  -- dropped (token, prototype) pairs, 0..1
ALTER TABLE metrics ADD COLUMN moe_load_min REAL;          -- fewest tokens of one expert (layer, microbatch)
ALTER TABLE metrics ADD COLUMN moe_load_max REAL;          -- most tokens of one expert
ALTER TABLE metrics ADD COLUMN moe_load_cv REAL;           -- coefficient of variation of tokens per expert
ALTER TABLE metrics ADD COLUMN moe_experts_empty REAL;     -- experts with no tokens, mean per layer and microbatch
