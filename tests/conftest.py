import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))  # test helpers (wandb_offline)

# The tests' models are tiny: one thread is faster than two, and it keeps the suite's speed
# independent of whatever else shares the CPU.
torch.set_num_threads(1)
