"""Tests of the benchmarks (``bench/``): they run end to end on a tiny budget."""
