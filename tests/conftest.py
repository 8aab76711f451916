from pathlib import Path

import pytest
import torch

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

torch.set_num_threads(1)


@pytest.fixture
def shared_data() -> Path:
    if not (SHARED_DATA / "a9a" / "a9a.gz").is_file():
        pytest.skip(f"shared data not present at {SHARED_DATA} (a9a/MNIST files are never committed)")
    return SHARED_DATA


def draw_batch(task, seed: int = 0, call: int = 1):
    """Every agent's mini-batch of one access, drawn as the engine draws it (keyed per agent)."""
    from privdl.keys import Draws, Keys

    rows = torch.arange(task.n)
    return task.sample(Draws(Keys(seed, task.n), "batch", call, rows.numpy(), rows.numpy()), rows)


def draw_lot(task, rates, seed: int = 0, call: int = 1):
    """Every agent's Poisson lot of one access (batch, mask), as the engine draws it."""
    from privdl.keys import Draws, Keys

    rows = torch.arange(task.n)
    return task.sample_lot(Draws(Keys(seed, task.n), "lot", call, rows.numpy(), rows.numpy()), rows, rates)
