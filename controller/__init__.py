"""The Raft-replicated controller: masters, epochs, SyncStateSets, topics and versioned metadata."""
