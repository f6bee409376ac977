"""Learn2PD features and labels: the filter's view and the training recipe's reading of a trace."""

import torch

from dllm_decode.eval.training.filter import steps_from_trace
from dllm_decode.filters.features import SETTLED, block_confidence, slots_to_window

INF = float("inf")


def test_block_confidence_pads_committed_and_missing_slots_with_settled():
    confidence = torch.tensor([[0.9, -INF, 0.3, 0.6]])
    features = block_confidence(confidence, offset=0, block=torch.tensor([[0, 4]]), width=6)
    assert torch.allclose(features, torch.tensor([[0.9, SETTLED, 0.3, 0.6, SETTLED, SETTLED]]))


def test_block_confidence_follows_each_rows_block_and_crops():
    # window starts at column 4; row 0's block is [6, 10), row 1's is [4, 8)
    confidence = torch.arange(1, 7, dtype=torch.float32).repeat(2, 1) / 10
    features = block_confidence(confidence, offset=4, block=torch.tensor([[6, 10], [4, 8]]), width=3)
    assert torch.allclose(features, torch.tensor([[0.3, 0.4, 0.5], [0.1, 0.2, 0.3]]))


def test_slots_to_window_inverts_the_slot_map():
    block = torch.tensor([[6, 10], [4, 8]])
    per_slot = torch.tensor([[True, False, True], [False, True, True]])
    window = slots_to_window(per_slot, offset=4, block=block, window_width=6)
    assert window.tolist() == [[False, False, True, False, True, False],
                               [False, True, True, False, False, False]]


def test_steps_from_hand_made_trace():
    final = torch.tensor([[5, 6, 9, 8, 1, 1, 1, 1],
                          [2, 2, 2, 2, 3, 4, 4, 4]])
    trace = [
        {"rows": torch.tensor([0, 1]), "offset": 0, "block_step": 0,
         "confidence": torch.tensor([[0.9, -INF, 0.3, 0.6], [0.2, 0.4, -INF, -INF]]),
         "tokens": torch.tensor([[5, 6, 7, 8], [2, 0, 2, 2]]),
         "commit": torch.zeros(2, 4, dtype=torch.bool)},
        {"rows": torch.tensor([1]), "offset": 4, "block_step": 0,       # row 0 already finished
         "confidence": torch.tensor([[0.7, 0.8, -INF, 0.1]]),
         "tokens": torch.tensor([[3, 5, 4, 4]]), "commit": torch.zeros(1, 4, dtype=torch.bool)},
    ]
    data = steps_from_trace(trace, final, block_length=4, width=4, first_prompt=10)
    assert data.prompt.tolist() == [10, 11, 11]
    assert torch.allclose(data.features, torch.tensor(
        [[0.9, SETTLED, 0.3, 0.6], [0.2, 0.4, SETTLED, SETTLED], [0.7, 0.8, SETTLED, 0.1]]))
    assert data.valid.tolist() == [[True, False, True, True], [True, True, False, False],
                                   [True, True, False, True]]
    # label: the step's prediction equals the final token at that column
    assert data.labels.tolist() == [[True, True, False, True], [True, False, True, True],
                                    [True, False, True, True]]
