"""Limits shared by the command options and the study file, so `epi run --threads` and a study
file's `[run] threads` refuse the same values. Standard library only."""

# More threads than this is a typo, not a machine (llama.cpp segfaults on 10^5).
MAX_THREADS = 1024
MAX_SEED = 2**32 - 1  # numpy's and llama.cpp's seed range
DAY_S = 86_400.0  # the longest wait a setting may ask for
