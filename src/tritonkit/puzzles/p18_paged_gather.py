"""Puzzle 18: gather a paged KV cache through its block table.

A serving engine keeps each sequence's cached keys (or values) in pages of page_size token rows,
wherever free pages were when the sequence grew: token t of sequence b lives in page
block_table[b, t // page_size], at row t % page_size of that page. This kernel gathers each
sequence's rows into a contiguous tensor, zeros past its length:

    out[b, t, :] = cache[block_table[b, t // page_size], t % page_size, :]     t < seq_lens[b]
    out[b, t, :] = 0                                                           seq_lens[b] <= t < max_len

Shapes: cache is (num_pages, page_size, D), float32 or bfloat16, last dimension contiguous
(strides passed); block_table is (B, max_pages) int32 and seq_lens (B,) int32; out is (B, max_len,
D), contiguous. A sequence owns only the rows of its seq_lens[b] tokens: the rest of its last page,
and the pages its table's later entries name (leftovers), belong to no one, and the checker fills
those rows with NaN. So a token past the length must read nothing, neither its table entry nor a
cache row.

Blocks: a grid of cdiv(max_len, BLOCK_T) x B programs, BLOCK_T = 16 tokens, BLOCK_D = next power of
two >= D. Program (pt, b) loads seq_lens[b], then its BLOCK_T tokens' page numbers from row b of
the table, then their [BLOCK_T, BLOCK_D] rows of the cache, and stores them (zeros past the
length) to out[b].
"""

import torch
import triton
import triton.language as tl


@triton.jit
def paged_gather_kernel(
    p_cache, p_table, p_lens, p_out, max_len, dim, page_size, stride_page, stride_slot, stride_table,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """BLOCK_T tokens of sequence program_id(1): their cache rows, found through the block table, or zeros."""
    i_t, i_b = tl.program_id(0), tl.program_id(1)
    o_t = i_t * BLOCK_T + tl.arange(0, BLOCK_T)
    o_d = tl.arange(0, BLOCK_D)
    seq_len = tl.load(p_lens + i_b)
    m_t = o_t < seq_len
    b_pages = tl.load(p_table + i_b * stride_table + o_t // page_size, mask=m_t, other=0)  # [BLOCK_T]
    o_rows = b_pages.to(tl.int64)[:, None] * stride_page + (o_t % page_size)[:, None] * stride_slot
    m_d = o_d[None, :] < dim
    b_rows = tl.load(p_cache + o_rows + o_d[None, :], mask=m_t[:, None] & m_d, other=0.0)  # [BLOCK_T, BLOCK_D]
    o_out = (i_b * max_len + o_t)[:, None] * dim + o_d[None, :]
    tl.store(p_out + o_out, b_rows, mask=(o_t[:, None] < max_len) & m_d)


def paged_gather(cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor, out: torch.Tensor) -> None:
    """The launcher (given)."""
    batch, max_len, dim = out.shape
    BLOCK_T = 16
    grid = (triton.cdiv(max_len, BLOCK_T), batch)
    paged_gather_kernel[grid](
        cache, block_table, seq_lens, out, max_len, dim, cache.shape[1], cache.stride(0), cache.stride(1),
        block_table.stride(0), BLOCK_T=BLOCK_T, BLOCK_D=triton.next_power_of_2(dim),
    )  # fmt: skip


# ===== checker data: not part of the learner's file =====
from tritonkit.puzzles._base import Mistake, OffLimits, Probe, Puzzle  # noqa: E402
from tritonkit.registry import Tolerance  # noqa: E402


def _paged(case, dtype, device, gen):
    """A cache, block table and lengths. Lengths from 0 to max_len (sequence 0 full). The pages the sequences own
    are pages 0 .. owned - 1 in a random order; after them come max_pages spare pages, which the table's leftover
    entries name (so every page number in the table, and every row a mistaken offset reaches, lies inside the cache).
    Rows no token owns are NaN."""
    batch, max_len, page_size, dim = case["b"], case["max_len"], case["page_size"], case["d"]
    lens = torch.randint(0, max_len + 1, (batch,), generator=gen, device=device)
    lens[0] = max_len
    max_pages = -(-max_len // page_size) + 1  # one leftover at least: a page index one too far stays in the table
    pages = [-(-length // page_size) for length in lens.tolist()]
    owned = sum(pages)
    table = owned + torch.randint(0, max_pages, (batch, max_pages), generator=gen, device=device)
    order = torch.randperm(owned, generator=gen, device=device)
    start = 0
    for sequence, count in enumerate(pages):
        table[sequence, :count] = order[start : start + count]
        start += count
    cache = torch.randn((owned + max_pages) * page_size, dim, generator=gen, device=device)
    tokens = torch.arange(max_len, device=device)
    rows = table[:, tokens // page_size] * page_size + tokens % page_size  # [B, max_len]
    is_owned = torch.zeros(cache.shape[0], dtype=torch.bool, device=device)
    is_owned[rows[tokens[None, :] < lens[:, None]]] = True
    cache[~is_owned] = float("nan")
    return cache.view(-1, page_size, dim).to(dtype), table.to(torch.int32), lens.to(torch.int32)


def _gathered(cache, table, lens, max_len, *, page_of=None, row_of=None, visible=None):
    """out in float64, with the page index of token t (page_of(t, page_size)), its flat cache row (row_of(page, t,
    page_size)) or the tokens read (visible(t, lens, max_len), [B, max_len] bool) replaced by a mistake's."""
    page_size, dim = cache.shape[1], cache.shape[2]
    tokens = torch.arange(max_len, device=cache.device)
    pages = table[:, tokens // page_size if page_of is None else page_of(tokens, page_size)].long()
    rows = pages * page_size + tokens % page_size if row_of is None else row_of(pages, tokens, page_size)
    seen = tokens[None, :] < lens[:, None] if visible is None else visible(tokens, lens, max_len)
    flat = cache.reshape(-1, dim)
    gathered = flat[rows.clamp(0, flat.shape[0] - 1)]  # [B, max_len, D]; a mistaken row past the end is not seen
    return torch.where(seen[..., None], gathered, torch.zeros_like(gathered))


def _reference(cache, table, lens, case):
    return _gathered(cache, table, lens, case["max_len"])


def _mistake(**mistake):
    return lambda cache, table, lens, case, launch: _gathered(cache, table, lens, case["max_len"], **mistake)


_PAGE = "token t is in page block_table[b, t // page_size] (page index t // page_size, counted from 0)"
_OFFSET = "token t is at cache[page, t % page_size]: page * stride_page + (t % page_size) * stride_slot"
_PROBE = Probe(
    case={"b": 3, "max_len": 40, "page_size": 8, "d": 8},
    make_inputs=_paged,
    description="random pages, in a random order",
    mistakes=(
        Mistake(
            "page-off-by-one",
            f"each token reads the next page of its table row: {_PAGE}",
            _mistake(page_of=lambda t, size: t // size + 1),
        ),
        Mistake(
            "page-off-by-one",
            f"the page index is rounded up (cdiv(t, page_size)): only the first token of each page is right. {_PAGE}",
            _mistake(page_of=lambda t, size: (t + size - 1) // size),
        ),
        Mistake(
            "offset-without-page-size",
            f"the page number is not multiplied by the page size (page + slot as a row number): {_OFFSET}",
            _mistake(row_of=lambda pages, t, size: pages + t % size),
        ),
        Mistake(
            "offset-without-page-size",
            f"the row inside the page is t, not t % page_size: {_OFFSET}",
            _mistake(row_of=lambda pages, t, size: pages * size + t),
        ),
        Mistake(
            "reads-past-length",
            "tokens past the sequence's length read the cache: their rows belong to no one (NaN here; another "
            "sequence's, or freed, in an engine). Mask the table and cache loads with t < seq_len (other=0), so "
            "those tokens store zeros",
            _mistake(visible=lambda t, lens, max_len: (t < max_len)[None, :].expand(len(lens), -1)),
        ),
    ),
)

PUZZLE = Puzzle(
    title="paged KV-cache gather through a block table",
    kernel="paged_gather_kernel",
    launcher="paged_gather",
    make_inputs=_paged,
    reference=_reference,
    reference_takes_case=True,  # max_len comes from the case
    out_shape=lambda case: (case["b"], case["max_len"], case["d"]),
    cases=(
        {"b": 1, "max_len": 1, "page_size": 4, "d": 1},
        {"b": 3, "max_len": 37, "page_size": 8, "d": 20},
        {"b": 4, "max_len": 50, "page_size": 16, "d": 64},
        {"b": 2, "max_len": 70, "page_size": 5, "d": 12},
    ),
    gpu_cases=(
        {"b": 64, "max_len": 4096, "page_size": 16, "d": 128},
        {"b": 7, "max_len": 3000, "page_size": 64, "d": 80},
    ),
    dtypes=(torch.float32, torch.bfloat16),
    tolerance=lambda case, dtype, device: Tolerance(atol=0.0, rtol=0.0),  # rows are copied, not computed
    probes=(_PROBE,),
    off_limits=OffLimits(
        "reads-past-length",
        "tokens past the sequence's length load cache rows that belong to no one, even if their values are "
        "dropped afterwards: in an engine those rows are another sequence's or freed, and a leftover table entry "
        "may name no page at all. Mask the table and cache loads with t < seq_len",
        lambda case, cache, table, lens: (torch.isnan(cache), None, None),
    ),
    hints=(
        "Token offsets from tl.program_id(0) as in puzzle 1, the sequence from tl.program_id(1); load "
        "seq_len = tl.load(p_lens + b) and mask every token with t < seq_len.",
        "Page numbers: tl.load(p_table + b * stride_table + t // page_size, mask=..., other=0), a [BLOCK_T] vector.",
        "Row addresses: page * stride_page + (t % page_size) * stride_slot, then [:, None] and + o_d[None, :] for "
        "the [BLOCK_T, BLOCK_D] tile (convert the page numbers to int64 first: a big cache passes 2**31 elements).",
        "Load the tile with mask=(t < seq_len)[:, None] & (o_d < D)[None, :] and other=0.0, and store it to out at "
        "(b * max_len + t) * D + d for every t < max_len: the masked tokens store their zeros.",
    ),
)
