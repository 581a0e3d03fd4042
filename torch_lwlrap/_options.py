"""Option values every layer shares, kept free of torch so the command line can parse arguments without it."""

#: The tie rules of every ranking function and metric; :mod:`torch_lwlrap._tie_rules` defines them.
TIES = ("max", "index", "expected")

#: The ranking engine's paths (:mod:`torch_lwlrap._engine_config`): ``"auto"`` picks per device.
ENGINES = ("auto", "sort", "count", "numba", "triton")

#: What a sample without a positive label (or, for NDCG, whose ideal DCG is 0) adds to the retrieval metrics:
#: a score of 0, or nothing (left out of the mean).
EMPTY_TARGET = ("zero", "skip")

#: The gain functions of graded NDCG: ``2**rel - 1`` (the learning-to-rank write-up) or ``rel`` (scikit-learn).
GAINS = ("exponential", "linear")

#: The rank correlations per sample.
CORRELATIONS = ("spearman", "kendall")
