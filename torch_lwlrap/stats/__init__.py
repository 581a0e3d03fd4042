"""Resampling statistics that know nothing of ranks: the bootstrap's Poisson weights keyed by each sample's position
in its process's stream, weighted sums of per-class and per-sample values, percentile intervals and paired
p-values (:mod:`._bootstrap`)."""
