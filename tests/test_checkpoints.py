"""tritonkit.integrations.checkpoints: AWQ's and GPTQ's packed int32 layers, written here from their documented
layouts, convert to tritonkit's INT4 layout exactly; bad tensors are refused by name."""

import pytest
import torch

import tritonkit as tk
from tritonkit.integrations import checkpoints


def _codes(qweight):
    """tritonkit's (N, K / 2) bytes as codes (N, K)."""
    return torch.stack((qweight & 15, qweight >> 4), dim=-1).flatten(-2).to(torch.int32)


def _pack_int32(values, order):
    """(R, C * 8) values 0..15 as int32 (R, C), nibble i holding column 8c + order[i]."""
    grouped = values.to(torch.int64).unflatten(-1, (-1, 8))[..., list(order)]  # nibble i <- column order[i]
    packed = (grouped << (4 * torch.arange(8))).sum(-1)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def _quantized(n=48, k=256, group=64):
    torch.manual_seed(0)
    return tk.ops.int4_quantize(torch.randn(n, k) * 0.02, group_size=group)


def test_awq_layout_converts_exactly():
    qweight, scales, zeros = _quantized()
    awq_qweight = _pack_int32(_codes(qweight).T, checkpoints.AWQ_ORDER)  # (K, N / 8)
    awq_zeros = _pack_int32(zeros.T.to(torch.int32), checkpoints.AWQ_ORDER)  # (K / G, N / 8)
    ours = checkpoints.int4_from_awq(awq_qweight, awq_zeros, scales.T.half(), group_size=64)
    assert torch.equal(ours[0], qweight) and torch.equal(ours[2], zeros)
    assert torch.equal(ours[1], scales.half().float())


@pytest.mark.parametrize("zero_offset", [1, 0])
def test_gptq_layout_converts_exactly(zero_offset):
    qweight, scales, zeros = _quantized()
    rows = _codes(qweight).T  # (K, N)
    eights = rows.unflatten(0, (-1, 8)).permute(0, 2, 1).flatten(1)  # (K / 8, N * 8): rows 8r .. 8r + 7 of column n
    gptq_qweight = _pack_int32(eights, tuple(range(8)))  # (K / 8, N), nibble i holding row 8r + i
    stored = (zeros.to(torch.int32).T - zero_offset) & 15  # the original format keeps zero - 1, wrapped
    gptq_zeros = _pack_int32(stored, tuple(range(8)))
    g_idx = torch.arange(256, dtype=torch.int32) // 64
    ours = checkpoints.int4_from_gptq(gptq_qweight, gptq_zeros, scales.T.half(), g_idx, group_size=64,
                                      zero_offset=zero_offset)  # fmt: skip
    assert torch.equal(ours[0], qweight) and torch.equal(ours[2], zeros)


def test_bad_checkpoint_tensors_are_refused_by_name():
    qweight = torch.zeros(256, 6, dtype=torch.int32)
    with pytest.raises(TypeError, match=r"qweight must be a 2-D torch\.int32 tensor"):
        checkpoints.int4_from_awq(qweight.to(torch.int64), torch.zeros(4, 6, dtype=torch.int32), torch.zeros(4, 48))
    with pytest.raises(ValueError, match=r"qzeros must be \(4, 6\) and scales \(4, 48\)"):
        checkpoints.int4_from_awq(qweight, torch.zeros(2, 6, dtype=torch.int32), torch.zeros(4, 48), group_size=64)
    act_order = torch.randperm(256).to(torch.int32) // 64
    with pytest.raises(ValueError, match="act-order"):
        checkpoints.int4_from_gptq(torch.zeros(32, 48, dtype=torch.int32), torch.zeros(4, 6, dtype=torch.int32),
                                   torch.zeros(4, 48), act_order, group_size=64)  # fmt: skip
