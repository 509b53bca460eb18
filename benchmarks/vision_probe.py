"""Can a VLM tell FrozenLake's cells apart from its image tokens? A probe of the vision tower's output.

    .venv/bin/python benchmarks/vision_probe.py tiny-vl                                   # the fresh tower
    .venv/bin/python benchmarks/vision_probe.py tiny-vl --weights RUN/reference.pt        # after a warm-start
    .venv/bin/python benchmarks/vision_probe.py RUN/ckpt_000200                           # a run's checkpoint

For the frames of ``--boards`` random boards (the game's ``frame()``, rendered by the model's own
processor), the merged image-token embeddings the decoder receives (one per cell for tiny-vl), grouped
by the cell each token shows (the game's grid text: ``P`` the player, ``O`` a hole, ``G`` the goal,
``_`` ice). It prints each cell type's mean embedding's cosine to every other's and a nearest-centroid
accuracy. The decoder normalises its input (RMSNorm), so two types whose means point the same way
(cosine ~1) look alike to it whatever their lengths: a policy reading such tokens cannot see where it
stands even when nearest-centroid, which sees lengths, still tells them apart. ~20 s on 2 CPU cores.
Writes benchmarks/results/vision-probe-<label>.json (``--label``; default: no file).
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from _util import RESULTS_DIR, machine

from arl.engine.images import ImageRenderer
from arl.envs.frozen_lake import FrozenLakeEnv
from arl.models import resolve_model


def load(model: str, weights: str | None) -> tuple[torch.nn.Module, str]:
    from transformers import AutoModelForImageTextToText

    path = resolve_model(model)
    vlm = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    if weights:  # a run's reference.pt (the warm-started weights): a state dict of the same model
        state = torch.load(weights, map_location="cpu")
        result = vlm.load_state_dict(state, strict=True)
        assert not result.missing_keys and not result.unexpected_keys
    return vlm, path


def cell_embeddings(vlm: torch.nn.Module, renderer: ImageRenderer, boards: int) -> tuple[np.ndarray, np.ndarray]:
    """``(embeddings [tokens, hidden], cell type per token)`` over the frames of boards 0..boards-1."""
    feats, labels = [], []
    for seed in range(boards):
        env = FrozenLakeEnv(render_mode="rgb_array")
        env.reset(seed=seed)
        cells = [c for c in env.grid_text() if not c.isspace()]  # one per cell, row by row
        pixels, grid = renderer._pixels([env.frame()])
        with torch.no_grad():
            out = vlm.model.get_image_features(torch.from_numpy(pixels), torch.from_numpy(grid))
        emb = getattr(out, "pooler_output", out)
        emb = torch.cat(list(emb)) if isinstance(emb, (list, tuple)) else emb
        if len(emb) != len(cells):
            raise SystemExit(f"{len(emb)} image tokens for {len(cells)} cells: this probe needs one token per cell")
        feats.append(emb.numpy())
        labels += cells
    return np.concatenate(feats), np.array(labels)


def probe(x: np.ndarray, y: np.ndarray) -> dict:
    kinds = sorted(set(y.tolist()))
    centroids = np.stack([x[y == k].mean(0) for k in kinds])
    unit = centroids / np.linalg.norm(centroids, axis=1, keepdims=True)
    nearest = np.array(kinds)[np.argmin(((x[:, None] - centroids[None]) ** 2).sum(-1), axis=1)]
    cosine = unit @ unit.T
    off = cosine[~np.eye(len(kinds), dtype=bool)]
    return {"kinds": kinds, "counts": [int((y == k).sum()) for k in kinds], "centroid_cosine": cosine.round(4).tolist(),
            "max_offdiag_cosine": float(off.max()), "min_offdiag_cosine": float(off.min()),
            "nearest_centroid_acc": float((nearest == y).mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", help="a zoo name (tiny-vl) or a model/checkpoint directory")
    parser.add_argument("--weights", help="a state dict to load over it (a run's reference.pt)")
    parser.add_argument("--boards", type=int, default=40)
    parser.add_argument("--label", help="write benchmarks/results/vision-probe-LABEL.json")
    args = parser.parse_args()
    vlm, path = load(args.model, args.weights)
    x, y = cell_embeddings(vlm, ImageRenderer(path), args.boards)
    result = probe(x, y)
    kinds = result["kinds"]
    print(f"{args.model}{' + ' + args.weights if args.weights else ''}: {len(y)} image tokens, "
          f"{dict(zip(kinds, result['counts'], strict=True))}")
    print("cosine of the cell types' mean embeddings:")
    print("      " + "  ".join(f"{k:>6}" for k in kinds))
    for k, row in zip(kinds, result["centroid_cosine"], strict=True):
        print(f"{k:>6}" + "  ".join(f"{c:6.3f}" for c in row))
    print(f"nearest-centroid accuracy {result['nearest_centroid_acc']:.3f}")
    if args.label:
        out = RESULTS_DIR / f"vision-probe-{args.label}.json"
        out.write_text(json.dumps({"model": args.model, "weights": args.weights, "boards": args.boards,
                                   **result, "machine": machine()}, indent=1))
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
