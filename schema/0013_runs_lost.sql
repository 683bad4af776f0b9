-- 0013_runs_lost.sql — the ranks whose loss paused a run across nodes
-- (state.h run_lost): the node (nodes.id), the first global rank lost and
-- its local rank on that node, and how many ranks went (a whole node: all
-- of its ranks, local ranks lost_local_rank .. + lost_ranks - 1). NULL:
-- none known (a run that lost no rank, or whose lost rank no one named).
-- Set when the run pauses for the loss, cleared when its group forms again.
ALTER TABLE runs ADD COLUMN lost_node INTEGER;
ALTER TABLE runs ADD COLUMN lost_rank INTEGER;
ALTER TABLE runs ADD COLUMN lost_local_rank INTEGER;
ALTER TABLE runs ADD COLUMN lost_ranks INTEGER;
