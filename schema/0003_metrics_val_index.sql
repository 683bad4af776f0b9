-- 0003_metrics_val_index.sql — the newest val_loss of a run (status, list,
-- watch) without walking every step since the last eval: a run with
-- train.eval_every 0 has no val_loss at all, and its status would scan all
-- its metrics rows (0.6 s at 2M steps). Only rows with a val_loss.
CREATE INDEX metrics_val ON metrics(run, step) WHERE val_loss IS NOT NULL;
