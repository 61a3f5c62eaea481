"""The broker process: produce/consume/ledger service around one commit log, and role changes."""
