"""Benchmarks of keras_xf against keras-hub on the same backend (`make bench`)."""
