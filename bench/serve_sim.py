"""The PagedAttention comparison (Kwon et al., SOSP 2023, arXiv:2309.06180) on both workloads, measured.

Serves a ShareGPT-like and an Alpaca-like trace on a simulated A100-40GB running OPT-13B (12 GiB of KV), with
contiguous KV reservations through minialloc's caching allocator and with paged KV blocks, and prints the share of
KV memory holding tokens, the three kinds of waste, concurrency and the savings of block sharing under parallel
sampling and beam search (see minialloc/serving.py for the model and how the lengths were chosen).

    .venv/bin/python bench/serve_sim.py [--requests N] [--seed S]
"""

from __future__ import annotations

import argparse
import sys

from minialloc.serving import WORKLOADS, format_table, serve_sim


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for i, workload in enumerate(WORKLOADS):
        if i:
            print()
        print(format_table(serve_sim(workload, args.requests, args.seed)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
