-- 0014_moe_step_tokens.sql — per-expert figures of a whole MoE step, over
-- every rank's microbatches (trainer.h step_moe's step_* fields), beside
-- 0005's per-(layer, microbatch) figures. NULL for a dense model and for
-- rows written before this migration. Same names and units as m6.proto's
-- MetricRow.

ALTER TABLE metrics ADD COLUMN moe_step_tokens_min INTEGER;     -- fewest tokens of one (MoE block, expert) in the step
ALTER TABLE metrics ADD COLUMN moe_step_tokens_max INTEGER;     -- most tokens of one (MoE block, expert) in the step
ALTER TABLE metrics ADD COLUMN moe_step_experts_empty INTEGER;  -- (MoE block, expert) pairs with no token in the step
ALTER TABLE metrics ADD COLUMN moe_step_dropped INTEGER;        -- (token, prototype) pairs dropped by capacity in the step
ALTER TABLE metrics ADD COLUMN moe_experts_idle INTEGER;        -- pairs with no token for train.expert_idle_steps steps or more; NULL when that is 0
