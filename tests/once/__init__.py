"""Tests whose outcome does not depend on `KERAS_BACKEND`: the house's rules, the benchmark
report's arithmetic, and the cross-backend parity check (which runs every backend in its own
subprocess). `make test` runs this folder once, and the rest of `tests/` once per backend."""
