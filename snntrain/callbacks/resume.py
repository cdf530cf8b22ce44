"""What a resumed run needs beyond Lightning's own state to continue exactly (random states, loader position)."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch


def _rng_state() -> dict[str, Any]:
    """The global random states as plain values and tensors (loadable with ``weights_only``)."""
    import random

    import numpy as np

    version, mt, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": [version, list(mt), gauss],
             "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)]}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    import random

    import numpy as np

    torch.set_rng_state(state["torch"])
    version, mt, gauss = state["python"]
    random.setstate((version, tuple(mt), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class ExactResume(L.Callback):
    """What a resumed run needs beyond Lightning's own state to continue exactly.

    * The global random states (torch, CUDA, NumPy, Python) are saved in every checkpoint and
      restored on resume, so anything that draws from them continues as in the uninterrupted run.
    * The training loader's position is restored. Lightning saves a stateful loader's
      ``state_dict`` with the loops and loads it when the fit loop sets up its data -- but a task
      whose ``configure_optimizers`` reads ``trainer.estimated_stepping_batches`` makes the loop
      set up (and start iterating) its loader before the checkpoint is restored. When resuming,
      that early loader is dropped at ``on_fit_start``, so the loop builds a fresh one and
      restores its position.
    """

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.ckpt_path is not None and trainer.fit_loop._combined_loader is not None:
            trainer.fit_loop._combined_loader = None

    def state_dict(self) -> dict[str, Any]:
        return _rng_state()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict:
            _set_rng_state(state_dict)
