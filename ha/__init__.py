"""Master/slave replication over raw TCP: handshake, fork repair, streaming, acks, SyncStateSet upkeep."""
