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
