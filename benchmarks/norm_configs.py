"""Sweep the norm kernels' launch plans on a GPU and print the fastest per width and dtype.

The data behind the sm90 tables of ``tritonkit/ops/norm/plan.py`` (norm_fwd_plan, norm_bwd_plan); what each
sweep found is in docs/kernels/norm.md. Every configuration is one of that module's plan dataclasses: forward
``FwdRowsPlan`` (rows per program, warps) and, for RMSNorm from 4096 wide, ``FwdLoopedPlan`` (chunk, warps, stages);
rows wider than one pass holds ``FwdSplitRowPlan`` (slice, warps, output piece); backward ``BwdRowsPlan``
(programs per SM, warps, rows per loop iteration, that loop's pipeline depth) and, for the wide backward,
``BwdSharedPlan`` (columns, rows, warps, programs per SM, a step published ahead) against ``given_plan``'s two
phases. Sweeps through the launchers pass each plan as ``plan=`` (norm_fwd, norm_bwd); the forward and backward
sweeps over whole rows time the kernels alone (16384 rows), launched with the plan's values.

    PYTHONPATH=src python3 benchmarks/norm_configs.py [WIDTH ...] [--bfloat16] [--float32] [--fwd-only]
        [--bwd-only] [--layer-norm] [--wide [--small-tiles]] [--launcher [--stages=1,3]] [--rows=16384]
        [--compile-only I/K]

``--bwd-only``: the backward kernel alone, of RMSNorm, or with ``--layer-norm`` of LayerNorm with a bias, whose
dbias accumulator takes registers that RMSNorm's table does not account for (each program a block of rows, as
the kernel sweep always ran; ``--launcher`` times the tables' interleaved steps). ``--wide``: the one-launch
backward of wide rows, whole launcher, over BwdSharedPlan tiles, each checked against the tables' path; with
``--small-tiles`` smaller tiles and more programs per SM; with ``--layer-norm`` LayerNorm's alone.
``--launcher``: the single-pass backward through its launcher, the dweight sum included, see print_launcher,
whose pipeline depths ``--stages=1,3`` sets. ``--rows=16384``: the rows of the sweeps but the wide ones. Every
sweep script here takes ``--compile-only I/K`` (see compile_only).
"""

import dataclasses
import itertools
import sys

import torch
import triton

from tritonkit._core.device import arch, sm_count
from tritonkit._core.ints import cdiv
from tritonkit.bench.harness import graph_replay_ms
from tritonkit.ops.norm.kernels import _norm_bwd_kernel, _norm_fwd_kernel, _rms_norm_fwd_looped_kernel
from tritonkit.ops.norm.launch import norm_bwd, norm_fwd
from tritonkit.ops.norm.plan import (
    MANY_ROWS,
    MAX_SINGLE_PASS,
    BwdRowsPlan,
    BwdSharedPlan,
    FwdLoopedPlan,
    FwdRowsPlan,
    FwdSplitRowPlan,
    given_plan,
    loads_weight_first,
    norm_bwd_plan,
    norm_fwd_plan,
    saves_registers,
)

DEVICE = torch.device("cuda")  # where the sweeps' tensors are made
ROWS_TOTAL = 16384


_COMPILE_SHARD = None  # (I, K) under --compile-only: run every K-th configuration once, from the I-th, untimed
_configurations = itertools.count()


def compile_only(argv) -> bool:
    """``--compile-only I/K`` in ``argv``: make median_ms run every K-th configuration once, from the I-th,
    untimed. K such processes at once fill Triton's cache on all CPU cores; the timed run then loads
    the compiled kernels instead of compiling them one by one. Returns whether the flag was given."""
    global _COMPILE_SHARD
    if "--compile-only" not in argv:
        return False
    _COMPILE_SHARD = tuple(int(v) for v in argv[argv.index("--compile-only") + 1].split("/"))
    return True


def median_ms(run):
    # CUDA-graph replays of about a millisecond each, as the harness times (graph_replay_ms): small kernels
    # are timed without launch gaps or the cache flush's write-back. A configuration needing more shared
    # memory than the device has (deep pipelines of wide fp32 rows) times as infinite.
    try:
        if _COMPILE_SHARD is not None:
            index, count = _COMPILE_SHARD
            if next(_configurations) % count == index:
                run()
                torch.cuda.synchronize()
            return 1.0
        run()  # compile outside the capture
        return graph_replay_ms(run)
    except triton.runtime.errors.OutOfResources:
        return float("inf")


def _as_tuple(plan) -> tuple:
    """A plan's fields in order, as the sweeps print and key their configurations."""
    return dataclasses.astuple(plan)


def fwd_ms(x, w, is_rms, plan, regs=0, bias=None):
    """The forward kernel alone with ``plan``: a FwdRowsPlan (whole rows, ``rows`` a program) or, RMSNorm only, a
    FwdLoopedPlan (a row per program, read in chunks, each pass's loop pipelined ``stages`` deep, as given).
    ``regs``: a register cap per thread (0: none); ``bias``: LayerNorm's, whose registers the single pass needs
    too. Launched here rather than through norm_fwd, which takes no register cap."""
    n_rows, n = x.shape
    y = torch.empty_like(x)
    mean, rstd = torch.empty(n_rows, device=x.device), torch.empty(n_rows, device=x.device)
    b = bias if bias is not None else x
    flags = dict(HAS_RES=False, HAS_W=True, HAS_B=bias is not None, STORE_H=False, STORE_STATS=True)
    if isinstance(plan, FwdLoopedPlan):

        def run():
            _rms_norm_fwd_looped_kernel[(n_rows,)](
                x, x, w, b, y, y, rstd, n, n, 0, n, 0, 1e-6, 0.0, **flags, BLOCK_N=plan.chunk,
                LOOP_STAGES=plan.stages, num_warps=plan.warps, maxnreg=regs or None,
            )  # fmt: skip

    else:
        block = triton.next_power_of_2(n)

        def run():
            _norm_fwd_kernel[(cdiv(n_rows, plan.rows),)](
                x, x, w, b, y, y, mean, rstd, n_rows, n, n, 0, n, 0, 1e-6, 0.0, IS_RMS=is_rms, **flags,
                ROWS=plan.rows, BLOCK_N=block, WEIGHT_FIRST=loads_weight_first(plan.rows, block, plan.warps),
                num_warps=plan.warps, maxnreg=regs or None,
            )  # fmt: skip

    return median_ms(run)


def bwd_ms(x, w, is_rms, plan, has_bias=False, regs=0):
    """The whole-row backward kernel alone with ``plan`` (a BwdRowsPlan; its pipeline depth as given), without the
    dweight/dbias sum that norm_bwd adds (``--launcher`` times that too); ``regs``: a register cap per thread."""
    n_rows, n = x.shape
    dy, dx = torch.randn_like(x), torch.empty_like(x)
    mean, rstd = torch.zeros(n_rows, device=x.device), torch.ones(n_rows, device=x.device)
    programs = plan.programs_per_sm * sm_count(x.device)
    part = torch.empty(programs, n, device=x.device)
    block = triton.next_power_of_2(n)

    def run():
        _norm_bwd_kernel[(programs,)](
            dy, dy, x, x, w, mean, rstd, dx, dx, part, part, n_rows, n, cdiv(n_rows, programs), n, 0, n, 0, n, 0,
            0.0, IS_RMS=is_rms, HAS_RES=False, HAS_W=True, HAS_B=has_bias, HAS_DH=False, STORE_DRES=False,
            ROWS=plan.rows, BLOCK_N=block, LOOP_STAGES=plan.stages,
            LOW_REGISTERS=saves_registers(plan.rows, block, plan.warps), INTERLEAVED=plan.interleaved,
            num_warps=plan.warps, maxnreg=regs or None,
        )  # fmt: skip

    return median_ms(run)


def print_fwd(x, w, is_rms, label):
    """Single pass: FwdRowsPlan (rows, warps), 8 to 128 elements a thread (one warp a row, as torch.compile's own,
    won at 1024 in fp32); LayerNorm with a bias. From 4096 wide, RMSNorm's looped forward too: FwdLoopedPlan
    (chunk, warps, stages), its first pass keeping the row in L2 for the second."""
    fwd = {}
    block = triton.next_power_of_2(x.shape[1])
    bias = None if is_rms else torch.randn_like(w)
    for rows, warps in itertools.product((1, 2, 4, 8, 16), (1, 2, 4, 8, 16)):
        if rows * block <= 16384 and 8 <= rows * block // (32 * warps) <= 128:
            fwd[(rows, warps)] = fwd_ms(x, w, is_rms, FwdRowsPlan(rows=rows, warps=warps), bias=bias)
    if is_rms and block >= 4096:
        for chunk, warps, stages in itertools.product((2048, 4096), (8, 16), (1, 2)):
            fwd[(chunk, warps, stages)] = fwd_ms(x, w, is_rms, FwdLoopedPlan(chunk=chunk, warps=warps, stages=stages))
    best = min(fwd, key=fwd.get)
    gbps = 2 * x.numel() * x.element_size() / fwd[best] / 1e6
    kind = "(rows, warps)" if len(best) == 2 else "looped (chunk, warps, stages)"
    print(f"fwd   {label} {kind}={best} {fwd[best]:.4f}  {gbps:6.0f} ({max(fwd.values()):.4f})")
    for config in sorted(fwd, key=fwd.get)[1:4]:
        print(f"        {config} {fwd[config]:.4f}")


def print_long_fwd(x, w, is_rms, label):
    """Rows wider than one pass holds: the split-row forward's FwdSplitRowPlan (slice, warps, output piece),
    through the launcher (the counters' zeroing included), LayerNorm with its bias."""
    fwd = {}
    bias = None if is_rms else torch.randn_like(w)
    for block, warps, sub_n in itertools.product((8192, 16384, 32768), (4, 8, 16, 32), (2048, 4096, 32768)):
        if 16 <= block // (32 * warps) <= 128 and sub_n >= 32 * warps:
            plan = FwdSplitRowPlan(slice=block, warps=warps, piece=min(sub_n, block))
            fwd[_as_tuple(plan)] = median_ms(
                lambda plan=plan: norm_fwd(x, w, bias, None, 1e-6, 0.0, is_rms, False, False, plan=plan)
            )
    now = _as_tuple(norm_fwd_plan(x.shape[1], x.element_size(), is_rms, arch(x.device)))
    best = min(fwd, key=fwd.get)
    gbps = 2 * x.numel() * x.element_size() / fwd[best] / 1e6
    print(f"fwd   {label} split (slice, warps, piece)={best} {fwd[best]:.4f}  {gbps:6.0f} "
          f"(now {now} {fwd.get(now, float('nan')):.4f}, worst {max(fwd.values()):.4f})")  # fmt: skip
    for config in sorted(fwd, key=fwd.get)[1:4]:
        print(f"        {config} {fwd[config]:.4f}")


def print_bwd(x, w, is_rms, label, per_sm_choices, has_bias=False):
    """The whole-row backward kernel alone: BwdRowsPlan (programs per SM, warps, rows, stages), each program a
    block of rows."""
    bwd = {}
    block = triton.next_power_of_2(x.shape[1])
    for per_sm, warps, rows, stages in itertools.product(per_sm_choices, (4, 8, 16), (1, 2, 4), (1, 3)):
        if rows * block <= 16384 and warps * 32 * 4 <= rows * block:
            plan = BwdRowsPlan(programs_per_sm=per_sm, warps=warps, rows=rows, stages=stages, interleaved=False)
            bwd[(per_sm, warps, rows, stages)] = bwd_ms(x, w, is_rms, plan, has_bias)
    best = min(bwd, key=bwd.get)
    gbps = 3 * x.numel() * x.element_size() / bwd[best] / 1e6
    print(f"bwd   {label} (per_sm, warps, rows, stages)={best} {bwd[best]:.4f}  {gbps:6.0f} "
          f"({max(bwd.values()):.4f})")  # fmt: skip
    for config in sorted(bwd, key=bwd.get)[1:5]:  # the runners-up, to see how flat the optimum is
        print(f"        {config} {bwd[config]:.4f}")
    unpipelined = {c: t for c, t in bwd.items() if c[3] == 1}
    best_unpipelined = min(unpipelined, key=unpipelined.get)
    print(f"        best without pipelining: {best_unpipelined} {unpipelined[best_unpipelined]:.4f}")


def wide_bwd_ms(x, w, is_rms, tile):
    """The whole backward launcher (the dweight/dbias sum included) with ``tile`` (a BwdSharedPlan) as its plan, at
    any width (the launcher runs a shared plan as the two phases where its programs may not wait)."""
    return launcher_bwd_ms(x, w, is_rms, tile)


def _wide_grads(x, w, is_rms, tile=None):
    """dx, dweight (and dbias) of the launcher on fixed inputs, with ``tile`` as its plan (None: as the tables
    say)."""
    dy = torch.randn(x.shape, device=x.device, dtype=x.dtype, generator=torch.Generator(x.device).manual_seed(1))
    grads = _bwd_launcher(x, w, is_rms, dy, tile)()
    return [g.float() for g in grads if g.numel()]  # absent gradients are empty tensors


def _agrees(grads, expected, dtype) -> bool:
    """Within the rounding of dx to ``dtype`` (and of a reordered fp32 sum), relative to each gradient's largest."""
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    return all((a - b).abs().max() <= tolerance * b.abs().max() for a, b in zip(grads, expected, strict=True))


# --wide's tiles: BwdSharedPlan(columns, rows, warps, programs per SM, a step published ahead), 16-64 elements a
# thread; with --small-tiles, 8-32 elements a thread and up to 8 programs per SM, in turn and ahead.
WIDE_TILES = tuple(
    BwdSharedPlan(*tile)
    for tile in itertools.product((2048, 4096, 8192), (1, 2, 4), (4, 8, 16), (1, 2, 4), (True,))
    if 16 <= tile[0] * tile[1] // (32 * tile[2]) <= 64
)
SMALL_WIDE_TILES = tuple(
    BwdSharedPlan(*tile)
    for tile in itertools.product((1024, 2048, 4096), (1, 2), (2, 4, 8), (2, 4, 6, 8), (False, True))
    if 8 <= tile[0] * tile[1] // (32 * tile[2]) <= 32
)


def print_wide(widths, dtypes, tiles, norms=(True, False)):
    """Rows that take the wide backward (bf16 LayerNorm and fp32 at 16384, everything wider): the one-launch
    backward's tile (BwdSharedPlan: columns, rows, warps, programs per SM, a step published ahead), LayerNorm with
    its bias, against the tables' two-phase plan (given_plan), or at 16384 LayerNorm's single pass. Each tile's
    gradients are checked against those of the tables' path ('MISMATCH' where they differ)."""
    for dtype, n, is_rms in itertools.product(dtypes, widths, norms):
        rows = max(1, ROWS_TOTAL * 16384 // n)  # the same bytes as 16384 x 16384
        table = norm_bwd_plan(n, dtype.itemsize, is_rms, not is_rms, rows >= MANY_ROWS, arch(DEVICE))
        single_pass = isinstance(table, BwdRowsPlan)
        if single_pass and is_rms:  # RMSNorm's single pass: 90-95% of the ceiling where it is taken
            continue
        x = torch.randn(rows, n, device=DEVICE, dtype=dtype)
        w = torch.randn(n, device=DEVICE, dtype=dtype)
        expected = _wide_grads(x, w, is_rms)
        times, wrong = {}, []
        for tile in tiles:
            if n // tile.block_n <= 132:
                times[_as_tuple(tile)] = wide_bwd_ms(x, w, is_rms, tile)
                if _COMPILE_SHARD is None and not _agrees(_wide_grads(x, w, is_rms, tile), expected, dtype):
                    wrong.append(_as_tuple(tile))
        table_tile = _as_tuple(table) if isinstance(table, BwdSharedPlan) else None
        if table_tile is not None and table_tile not in times:
            times[table_tile] = wide_bwd_ms(x, w, is_rms, table)
        # The two-phase backward, as where waiting is not safe (or LayerNorm's single pass where the table takes it)
        now = launcher_bwd_ms(x, w, is_rms, table if single_pass else given_plan(dtype.itemsize, arch(DEVICE)))
        best = min(times, key=times.get)
        gbps = 3 * x.numel() * x.element_size() / times[best] / 1e6
        label = f"{'rms' if is_rms else 'ln':<5} {str(dtype)[6:]:<9} {n:<6}"
        print(f"wide  {label} (block, rows, warps, per_sm, ahead)={best} {times[best]:.4f}  {gbps:6.0f} "
              f"(worst {max(times.values()):.4f}; table's tile {table_tile} {times.get(table_tile, float('nan')):.4f}; "
              f"{'single pass' if single_pass else 'two phases'} {now:.4f})"
              f"{' MISMATCH ' + str(wrong) if wrong else ''}", flush=True)  # fmt: skip
        for config in sorted(times, key=times.get)[1:4]:
            print(f"        {config} {times[config]:.4f}")


def _bwd_launcher(x, w, is_rms, dy, plan=None):
    """A call of the whole backward launcher (kernels and the dweight/dbias sum) on ``dy`` with ``plan`` (None: the
    tables'), with mean 0 and rstd 1 (LayerNorm with a bias)."""
    mean, rstd = torch.zeros(x.shape[0], device=x.device), torch.ones(x.shape[0], device=x.device)
    return lambda: norm_bwd(dy, None, x, w, None, None if is_rms else mean, rstd, 0.0, is_rms, not is_rms, plan=plan)


def launcher_bwd_ms(x, w, is_rms, plan=None):
    """The whole backward launcher (kernels and the dweight/dbias sum) with ``plan`` (None: the tables')."""
    return median_ms(_bwd_launcher(x, w, is_rms, torch.randn_like(x), plan))


BWD_FIELDS = ("programs_per_sm", "warps", "rows", "stages")  # the BwdRowsPlan fields print_launcher sweeps


def print_launcher(widths, dtypes, stages=(1, 3), n_rows=ROWS_TOTAL):
    """The single-pass backward through its launcher, so that the dweight/dbias sum, whose cost grows with the
    programs, is timed too (``--bwd-only`` times the kernel alone): the table's BwdRowsPlan with (programs per SM,
    warps, rows, stages) replaced, 8-64 elements a thread, ``stages`` deep, against the table's own; LayerNorm with
    its bias; ``n_rows`` rows."""
    for dtype, n, is_rms in itertools.product(dtypes, widths, (True, False)):
        plan = norm_bwd_plan(n, dtype.itemsize, is_rms, not is_rms, n_rows >= MANY_ROWS, arch(DEVICE))
        if not isinstance(plan, BwdRowsPlan):
            continue
        x = torch.randn(n_rows, n, device=DEVICE, dtype=dtype)
        w = torch.randn(n, device=DEVICE, dtype=dtype)
        dy = torch.randn_like(x)
        table = tuple(getattr(plan, field) for field in BWD_FIELDS)
        times = {table: median_ms(_bwd_launcher(x, w, is_rms, dy, plan))}
        block = triton.next_power_of_2(n)
        for config in itertools.product((1, 2, 4, 8), (2, 4, 8, 16), (1, 2, 4), stages):
            if config[2] * block <= 16384 and 8 <= config[2] * block // (32 * config[1]) <= 64 and config != table:
                swept = dataclasses.replace(plan, **dict(zip(BWD_FIELDS, config, strict=True)))
                times[config] = median_ms(_bwd_launcher(x, w, is_rms, dy, swept))
        best = min(times, key=times.get)
        gbps = 3 * x.numel() * x.element_size() / times[best] / 1e6
        label = f"{'rms' if is_rms else 'ln':<5} {str(dtype)[6:]:<9} {n:<6}"
        print(f"launcher {label} x {n_rows} rows (per_sm, warps, rows, stages)={best} {times[best]:.4f}  {gbps:6.0f} "
              f"(table's {table} {times[table]:.4f})", flush=True)  # fmt: skip
        for config in sorted(times, key=times.get)[1:4]:
            print(f"        {config} {times[config]:.4f}", flush=True)


def _option(name: str, default):
    """The value of ``NAME=VALUE`` in the command line, else ``default``."""
    given = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith(name + "=")]
    return given[-1] if given else default


def main():
    compile_only(sys.argv)
    all_dtypes = (torch.bfloat16, torch.float32)
    dtypes = [d for d in all_dtypes if f"--{str(d)[6:]}" in sys.argv] or all_dtypes
    if "--wide" in sys.argv:
        widths = [int(a) for a in sys.argv[1:] if a.isdigit()] or [16384, 65536, 131072]
        tiles = SMALL_WIDE_TILES if "--small-tiles" in sys.argv else WIDE_TILES
        norms = (False,) if "--layer-norm" in sys.argv else (True, False)
        print_wide(widths, dtypes, tiles, norms)
        return
    n_rows = int(_option("--rows", ROWS_TOTAL))
    if "--launcher" in sys.argv:
        widths = [int(a) for a in sys.argv[1:] if a.isdigit()] or [1024, 2048, 4096, 8192, 16384]
        stages = _option("--stages", "1,3")
        print_launcher(widths, dtypes, tuple(int(v) for v in stages.split(",")), n_rows)
        return
    print("kind  norm  dtype     n      best config            ms      GB/s   (worst ms)")
    widths = [int(a) for a in sys.argv[1:] if a.isdigit()] or [1024, 2048, 4096, 8192, 16384]
    bwd_only = "--bwd-only" in sys.argv
    fwd_only = "--fwd-only" in sys.argv
    layer_norm = "--layer-norm" in sys.argv
    norms = ((not layer_norm),) if bwd_only else (True, False)
    for dtype, n, is_rms in itertools.product(dtypes, widths, norms):
        long_rows = n > MAX_SINGLE_PASS  # the split-row forward; their backward is --wide's
        rows = ROWS_TOTAL * 16384 // n if long_rows else n_rows  # long: the bytes of 16384 x 16384
        x = torch.randn(rows, n, device=DEVICE, dtype=dtype)
        w = torch.randn(n, device=DEVICE, dtype=dtype)
        label = f"{'rms' if is_rms else 'ln':<5} {str(dtype)[6:]:<9} {n:<6}"
        if long_rows:
            print_long_fwd(x, w, is_rms, label)
            continue
        if not bwd_only:
            print_fwd(x, w, is_rms, label)
        if not fwd_only:
            print_bwd(x, w, is_rms, label, (1, 2, 4), has_bias=not is_rms)


if __name__ == "__main__":
    main()
