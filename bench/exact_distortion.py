"""Where cuhlm_exact's non-zero output distortion came from: float rounding, measured on the pair.

cuhlm_exact draws d from the x_hat it uploads, so its committed token follows y exactly, yet
the decode table recorded TVD(y_hat, y) of about 1e-5. With q = p, y_hat - y = (y - p)^+
(rho / Z - 1) with rho - Z = sum p - sum y, so TVD(y_hat, y) = |sum p - sum y| / 2: half the
normalisation error of the two laws. This decodes a few prompts with cuhlm_exact (every token
uploaded) in the pair's float32 and prints, over the uploads, the distortion as recorded before
(the laws as the models gave them, cast to float64), half the normalisation difference, the
largest |sum y - 1| of the target's float32 softmax, and the distortion the decode table
records now (both laws renormalised in float64)::

    python bench/exact_distortion.py --model-dir /work/cache/models/qwen25coder --k 119
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from edgespec.cuhlm.decode import _record_step
from edgespec.cuhlm.distortion import committed_law
from edgespec.cuhlm.policies import ExactTopKPolicy
from edgespec.data.chat import chat_token_ids
from edgespec.data.prepare import load_records
from edgespec.decoding.compression import reconstruct_topk, total_variation
from edgespec.decoding.config import DecodingConfig
from edgespec.decoding.tokenwise import generate_tokenwise
from edgespec.models.load import load_pair_from_dir, stop_token_ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model-dir", required=True, help="a fetched pair (models.cache_dir)")
    parser.add_argument("--k", type=int, default=119, help="cuhlm_exact's k*")
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--new", type=int, default=24, help="new tokens per prompt")
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    draft, target, tokenizer = load_pair_from_dir(args.model_dir, {"dtype": args.dtype}, 1)
    records = load_records("instructions", args.prompts, np.random.default_rng(3))
    prompts = [chat_token_ids(tokenizer, r.prompt) for r in records]
    cfg = DecodingConfig(
        max_new_tokens=args.new,
        temperature=1.0,
        eos_token_ids=stop_token_ids(tokenizer, target),
        pad_token_id=tokenizer.pad_token_id or 0,
        batch_size=args.prompts,
    )
    policy = ExactTopKPolicy(None, args.k)
    found: dict[str, list[float]] = {"before": [], "half_sum": [], "y_sum": [], "now": []}

    def on_step(step) -> None:
        rows = _record_step(step, [r.id for r in records], policy)
        up = np.flatnonzero(rows["uploaded"])
        x, y = step.draft_probs[up], step.target_probs[up]
        q = policy.sampling_distribution(None, x).to(torch.float64)  # as drawn, in x's dtype
        p = reconstruct_topk(x, args.k).to(torch.float64)  # as the engine verifies
        y64 = y.to(torch.float64)
        found["before"] += total_variation(committed_law(q, p, y64), y64).tolist()
        found["half_sum"] += (0.5 * (p.sum(-1) - y64.sum(-1)).abs()).tolist()
        found["y_sum"] += (y64.sum(-1) - 1).abs().tolist()
        found["now"] += rows["output_tvd"][up].tolist()

    start = time.perf_counter()
    generate_tokenwise(
        prompts, cfg, torch.Generator().manual_seed(1), draft, target, policy, on_step=on_step
    )
    values = {name: np.asarray(v) for name, v in found.items()}
    before, half, now = values["before"], values["half_sum"], values["now"]
    elapsed = time.perf_counter() - start
    print(f"{len(now)} uploads, k = {args.k}, {args.dtype}, {elapsed:.0f} s")
    print(f"TVD(y_hat, y) as recorded before: mean {before.mean():.3g}, max {before.max():.3g}")
    print(f"|sum p - sum y| / 2:              mean {half.mean():.3g}, max {half.max():.3g}")
    print(f"max |sum y - 1| (target softmax): {values['y_sum'].max():.3g}")
    print(f"TVD(y_hat, y) recorded now:       max {np.abs(now).max():.3g}")


if __name__ == "__main__":
    main()
