"""BookKeeper-compatible ledgers on the commit log: fencing, LAC, recovery with quorum coverage."""
