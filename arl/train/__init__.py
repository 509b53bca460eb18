"""Training: the synchronous trainer, the format warm-start, checkpoints and metrics logging."""

from arl.train.trainer import Trainer, evaluation_metrics

__all__ = ["Trainer", "evaluation_metrics"]
