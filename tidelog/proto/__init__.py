"""Wire definitions (.proto) and their generated modules; regenerate with `make proto`."""
