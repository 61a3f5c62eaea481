"""A deterministic simulator of tidelog's replication protocol: one thread, one seed, simulated time.

It runs the project's real decision code under a seeded schedule of faults and checks the safety
and liveness properties after every step (sim/README.md says which code runs for real and which
is modelled, and how to replay, shrink and mutate).
"""
