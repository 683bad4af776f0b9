-- 0012_nodes_ranks.sql — how many data-parallel ranks a node holds in its
-- current run: ranks rank .. rank + ranks - 1 (a node runs one rank per
-- device, m6d --devices; the coordinator places them, cluster.h
-- cluster_ranks_place). NULL with a rank set (rows written before this
-- migration, or a node holding one rank): 1.
ALTER TABLE nodes ADD COLUMN ranks INTEGER;
