"""Compile tritonkit's kernels, and a kernel using every debug helper, for sm_90 without a GPU.

Run by test_compiled_build.py in a fresh process without TRITON_INTERPRET: the interpreter accepts
code the compiler rejects, so this catches kernels that would only fail on a GPU. Prints one line per
kernel and exits non-zero on the first failure.
"""

import importlib
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget

from tritonkit import debug

tutorial = importlib.import_module("tritonkit.ops.tutorial")
matmul = importlib.import_module("tritonkit.ops.matmul")
norm = importlib.import_module("tritonkit.ops.norm")
softmax = importlib.import_module("tritonkit.ops.softmax")
activation = importlib.import_module("tritonkit.ops.activation")
puzzles = importlib.import_module("tritonkit.puzzles")
lora = importlib.import_module("tritonkit.ops.lora")
rope = importlib.import_module("tritonkit.ops.rope")
cross_entropy = importlib.import_module("tritonkit.ops.cross_entropy")
HOPPER = GPUTarget("cuda", 90, 32)
_GEMM_TILE = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_SIZE": 8, "UPCAST": False}
_LORA_STRIDES = ("stride_p_m", "stride_p_d", "stride_q_d", "stride_q_n", "stride_l1_d", "stride_l1_r",
                 "stride_l2_r", "stride_l2_n", "stride_out_m", "stride_out_n", "stride_pl1_m")  # fmt: skip


@triton.jit
def _every_helper_kernel(p_x, p_out, n_rows, n_cols, stride_row, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    o_r = debug.offsets_1d(BLOCK_R, tl.program_id(0))
    o_c = debug.offsets_1d(BLOCK_C, tl.program_id(1))
    m_rc = debug.mask_2d(o_r, o_c, n_rows, n_cols)
    b_x = tl.load(p_x + debug.offsets_2d(o_r, o_c, stride_row), mask=m_rc)
    debug.print_if("tile", "=0,>=1")
    debug.print_if(b_x, "!=0")
    debug.breakpoint_if("<=3,,=0")
    b_first = tl.load(p_x + o_c, mask=debug.mask_1d(o_c, n_cols))
    tl.store(p_out + debug.offsets_2d(o_r, o_c, stride_row), b_x + b_first[None, :], mask=m_rc)


def compile_one(name, fn, signature, constexprs, **options):
    source = triton.compiler.ASTSource(
        fn=fn, signature={**signature, **dict.fromkeys(constexprs, "constexpr")}, constexprs=constexprs
    )
    compiled = triton.compile(source, target=HOPPER, options=options or None)
    print(f"{name}: {len(compiled.asm['cubin'])} bytes of sm_90 code")


def main():
    compile_one(
        "debug helpers",
        _every_helper_kernel,
        {"p_x": "*fp32", "p_out": "*fp32", "n_rows": "i32", "n_cols": "i32", "stride_row": "i32"},
        {"BLOCK_R": 16, "BLOCK_C": 32},
    )
    compile_one(
        "copy",
        tutorial._copy_kernel,
        {"p_x": "*bf16", "p_out": "*bf16", "n_elements": "i64"},
        {"BLOCK_SIZE": 100, "BLOCK_POW2": 128},
    )
    for relu in (False, True):
        compile_one(
            f"add relu={relu}",
            tutorial._add_kernel,
            {"p_x": "*bf16", "p_y": "*bf16", "p_out": "*bf16", "n_elements": "i32"},
            {"APPLY_RELU": relu, "BLOCK_SIZE": 1024},
        )
    for dtype, is_uint8 in (("u8", True), ("fp16", False)):
        compile_one(
            f"rgb_to_grey {dtype}",
            tutorial._rgb_to_grey_kernel,
            {
                "p_img": f"*{dtype}",
                "p_out": f"*{dtype}",
                "height": "i32",
                "width": "i32",
                **dict.fromkeys(
                    ["stride_img_c", "stride_img_h", "stride_img_w", "stride_out_h", "stride_out_w"], "i32"
                ),
            },
            {"IS_UINT8": is_uint8, "BLOCK_H": 32, "BLOCK_W": 32},
        )
    for dtype, precision in (("bf16", "tf32"), ("fp16", "tf32"), ("fp32", "ieee"), ("fp32", "tf32")):
        compile_one(
            f"matmul {dtype} {precision}",
            matmul._matmul_kernel,
            {
                "p_a": f"*{dtype}",
                "p_b": f"*{dtype}",
                "p_c": f"*{dtype}",
                "M": "i32",
                "N": "i32",
                "K": "i32",
                **dict.fromkeys(
                    ["stride_a_m", "stride_a_k", "stride_b_k", "stride_b_n", "stride_c_m", "stride_c_n"], "i32"
                ),
            },
            {**_GEMM_TILE, "INPUT_PRECISION": precision},
            num_warps=8,
            num_stages=3,
        )
    for single_pass, block_n, rows in ((True, 4096, 2), (False, 4096, 1)):
        for is_rms in (True, False):
            flags = {"IS_RMS": is_rms, "HAS_RES": True, "HAS_W": True, "HAS_B": not is_rms}
            if single_pass or is_rms:  # only RMSNorm has a looped forward (_RMS_FWD_LOOPED)
                compile_one(
                    f"norm fwd rms={is_rms} single={single_pass}",
                    norm._norm_fwd_kernel,
                    {
                        **dict.fromkeys(["p_x", "p_res", "p_w", "p_b", "p_y", "p_h"], "*bf16"),
                        "p_mean": "*fp32",
                        "p_rstd": "*fp32",
                        **dict.fromkeys(
                            ["n_rows", "n_cols", "stride_x_row", "stride_res_row", "stride_y_row", "stride_h_row"],
                            "i32",
                        ),
                        "eps": "fp32",
                        "offset": "fp32",
                    },
                    {
                        **flags,
                        "STORE_H": True,
                        "SINGLE_PASS": single_pass,
                        "ROWS": rows,
                        "BLOCK_N": block_n,
                        "LOOP_STAGES": 2,
                        "WEIGHT_FIRST": is_rms,  # both placements of the weight load
                        "STORE_STATS": is_rms,  # with the backward's statistics and without
                    },
                    num_warps=8,
                )
            if not single_pass:
                compile_one(
                    f"norm fwd split row rms={is_rms}",  # the one-launch form, whose programs wait for each other
                    norm._norm_fwd_split_row_kernel,
                    {
                        **dict.fromkeys(["p_x", "p_res", "p_w", "p_b", "p_y", "p_h"], "*bf16"),
                        **dict.fromkeys(["p_mean", "p_rstd", "p_part"], "*fp32"),
                        "p_count": "*i32",
                        **dict.fromkeys(["n_rows", "n_cols", "n_blocks"], "i32"),
                        **dict.fromkeys(["stride_x_row", "stride_res_row", "stride_y_row", "stride_h_row"], "i32"),
                        "eps": "fp32",
                        "offset": "fp32",
                    },
                    {
                        **flags,
                        "STORE_H": True,
                        "BLOCK_N": 16384,
                        "SUB_N": 4096,
                        "BLOCKS_P2": 8,
                        "PHASES": 3,
                        "STORE_STATS": True,
                    },
                    num_warps=8,
                )
                continue
            bwd_strides = ["stride_dy_row", "stride_dh_row", "stride_x_row", "stride_res_row", "stride_dx_row",
                           "stride_dres_row"]  # fmt: skip
            bwd_tensors = {
                **dict.fromkeys(["p_dy", "p_dh", "p_x", "p_res", "p_w"], "*bf16"),
                "p_mean": "*fp32",
                "p_rstd": "*fp32",
            }
            bwd_outputs = {"p_dx": "*bf16", "p_dres": "*fp32", "p_dw_part": "*fp32", "p_db_part": "*fp32"}
            bwd_flags = {**flags, "HAS_DH": True, "STORE_DRES": True}
            compile_one(
                f"norm wide bwd row sums rms={is_rms}",
                norm._norm_bwd_row_sums_kernel,
                {
                    **{k: v for k, v in bwd_tensors.items() if k != "p_dh"},
                    "p_c_xhat": "*fp32",
                    "p_c_one": "*fp32",
                    **dict.fromkeys(["n_cols", "stride_dy_row", "stride_x_row", "stride_res_row"], "i32"),
                    "offset": "fp32",
                },
                {k: flags[k] for k in ("IS_RMS", "HAS_RES", "HAS_W")} | {"BLOCK_N": norm.LOOP_CHUNK, "LOOP_STAGES": 2},
                num_warps=8,
            )
            wide_block, wide_rows, wide_warps, _, _ = norm.WIDE_BWD_TILE[2]
            shared_block, shared_rows, shared_warps, _, _ = norm.WIDE_BWD_SHARED_TILE[4, True, False]
            for row_terms, rows, bwd_block, warps, ahead in (
                (norm.TILE.value, 4, block_n, 8, False),
                (norm.GIVEN.value, wide_rows, wide_block, wide_warps, False),
                (norm.SHARED.value, shared_rows, shared_block, shared_warps, False),  # column blocks waiting
                (norm.SHARED.value, shared_rows, shared_block, shared_warps, True),  # ... one step ahead
            ):
                compile_one(
                    f"norm bwd rms={is_rms} row_terms={row_terms} ahead={ahead}",
                    norm._norm_bwd_kernel,
                    {
                        **bwd_tensors,
                        "p_c_xhat": "*fp32",
                        "p_c_one": "*fp32",
                        "p_count": "*i32",
                        **bwd_outputs,
                        **dict.fromkeys(["n_rows", "n_cols", "rows_per_program", *bwd_strides], "i32"),
                        "offset": "fp32",
                    },
                    {
                        **bwd_flags,
                        "ROW_TERMS": row_terms,
                        "ROWS": rows,
                        "BLOCK_N": bwd_block,
                        "BLOCKS_P2": 16,
                        "LOOP_STAGES": 2 if row_terms != norm.SHARED.value else 1,
                        "LOW_REGISTERS": row_terms == norm.GIVEN.value,  # both orders
                        "AHEAD": ahead,
                    },
                    num_warps=warps,
                )
    compile_one(
        "norm sum of partials",
        norm._sum_partials_kernel,
        {
            "p_dw_part": "*fp32",
            "p_db_part": "*fp32",
            "p_dw": "*bf16",
            "p_db": "*bf16",
            "n_parts": "i32",
            "n_cols": "i32",
        },
        {"BLOCK_P": 512, "BLOCK_N": 8, "HAS_W": True, "HAS_B": True},
        num_warps=4,
    )
    # Whole rows, one block a program or a grid looping over blocks (pipelined)
    for grid_loop, block_n, rows in ((False, 1024, 4), (True, 2048, 2)):
        for log in (False, True):
            constexprs = {"LOG": log, "GRID_LOOP": grid_loop, "ROWS": rows, "BLOCK_N": block_n, "LOOP_STAGES": 2}
            compile_one(
                f"softmax fwd log={log} grid_loop={grid_loop}",
                softmax._softmax_fwd_kernel,
                {
                    "p_x": "*bf16",
                    "p_y": "*bf16",
                    "p_lse": "*fp32",
                    "n_rows": "i32",
                    "n_cols": "i32",
                    "stride_x_row": "i32",
                    "stride_y_row": "i32",
                },
                {**constexprs, "STORE_LSE": not log},  # with the backward's lse and without
                num_warps=8,
            )
            compile_one(
                f"softmax bwd log={log} grid_loop={grid_loop}",
                softmax._softmax_bwd_kernel,
                {
                    "p_dy": "*bf16",
                    "p_x": "*bf16",
                    "p_lse": "*fp32",
                    "p_dx": "*bf16",
                    "n_rows": "i32",
                    "n_cols": "i32",
                    "stride_dy_row": "i32",
                    "stride_x_row": "i32",
                    "stride_dx_row": "i32",
                },
                constexprs,
                num_warps=8,
            )
    # Rows split across programs, in the one-launch form whose programs wait for each other
    split = {"BLOCK_N": 8192, "BLOCKS_P2": 8, "PHASES": 3}
    row_args = {"p_part": "*fp32", "p_count": "*i32", **dict.fromkeys(["n_rows", "n_cols", "n_blocks"], "i32")}
    compile_one(
        "softmax fwd split row",
        softmax._softmax_fwd_split_row_kernel,
        {"p_x": "*bf16", "p_y": "*bf16", "p_lse": "*fp32", **row_args, "stride_x_row": "i32", "stride_y_row": "i32"},
        {"LOG": False, **split},
        num_warps=8,
    )
    compile_one(
        "softmax bwd split row",
        softmax._softmax_bwd_split_row_kernel,
        {
            **{"p_dy": "*bf16", "p_x": "*bf16", "p_lse": "*fp32", "p_dx": "*bf16", **row_args},
            **dict.fromkeys(["stride_dy_row", "stride_x_row", "stride_dx_row"], "i32"),
        },
        {"LOG": True, **split},
        num_warps=8,
    )
    for act in (activation.GELU_ERF, activation.GELU_TANH, activation.SILU):
        compile_one(
            f"activation fwd act={act}",
            activation._activation_fwd_kernel,
            {"p_x": "*bf16", "p_y": "*bf16", "n_elements": "i64"},
            {"ACT": act, "BLOCK_SIZE": 1024},
        )
        compile_one(
            f"activation bwd act={act}",
            activation._activation_bwd_kernel,
            {"p_dy": "*bf16", "p_x": "*bf16", "p_dx": "*bf16", "n_elements": "i64"},
            {"ACT": act, "BLOCK_SIZE": 1024},
        )
    for act in (activation.GELU_ERF, activation.GELU_TANH, activation.SILU):
        compile_one(
            f"gated fwd act={act}",
            activation._gated_fwd_kernel,
            {"p_gate": "*bf16", "p_up": "*bf16", "p_y": "*bf16", "n_elements": "i64"},
            {"ACT": act, "BLOCK_SIZE": 1024},
        )
        compile_one(
            f"gated bwd act={act}",
            activation._gated_bwd_kernel,
            {**dict.fromkeys(["p_dy", "p_gate", "p_up", "p_dgate", "p_dup"], "*bf16"), "n_elements": "i64"},
            {"ACT": act, "BLOCK_SIZE": 1024},
        )
    compile_puzzle_solutions()
    for dtype, precision, has_bias, r_pad in (("bf16", "tf32", True, 16), ("fp16", "tf32", False, 64),
                                              ("fp32", "ieee", True, 16), ("fp32", "tf32", False, 128)):  # fmt: skip
        compile_one(
            f"lora matmul {dtype} {precision} bias={has_bias} r_pad={r_pad}",
            lora._lora_matmul_kernel,
            {
                **dict.fromkeys(["p_p", "p_q", "p_l1", "p_l2", "p_bias", "p_out"], f"*{dtype}"),
                "p_pl1": "*fp32",
                **dict.fromkeys(["M", "N", "D", "R"], "i32"),
                "scale": "fp32",
                **dict.fromkeys(_LORA_STRIDES, "i32"),
            },
            {
                "HAS_BIAS": has_bias,
                "R_PAD": r_pad,
                "SPLIT": dtype != "fp32",
                **_GEMM_TILE,
                "INPUT_PRECISION": precision,
            },
            num_warps=8,
            num_stages=3,
        )
    rope_strides = [f"stride_{t}_{d}" for t in ("q", "k", "qo", "ko") for d in "bhtd"]
    rope_strides += [f"stride_{t}_{d}" for t in ("cos", "sin") for d in "btd"] + ["stride_pos_b", "stride_pos_t"]
    # Llama's full rotary with a shared table, and Phi-2's partial rotary (80 = 32 rotated + 48 copied)
    # gathered by position_ids; forward and backward of each.
    for has_pos, half, block_pass in ((False, 64, 0), (True, 16, 64)):
        for backward in (False, True):
            compile_one(
                f"rope backward={backward} position_ids={has_pos} pass={block_pass}",
                rope._rope_kernel,
                {
                    **dict.fromkeys(["p_q", "p_k", "p_cos", "p_sin"], "*bf16"),
                    "p_pos": "*i64",
                    **dict.fromkeys(["p_q_out", "p_k_out"], "*bf16"),
                    **dict.fromkeys(["n_tokens", "n_q_heads", "n_k_heads", "half", "n_pass", "n_positions"], "i32"),
                    **dict.fromkeys(rope_strides, "i32"),
                },
                {
                    "BACKWARD": backward,
                    "HAS_POS": has_pos,
                    "BLOCK_HQ": 32,
                    "BLOCK_HK": 8,
                    "BLOCK_HALF": half,
                    "BLOCK_PASS": block_pass,
                },
                num_warps=8,
            )
    for compute_loss, write_grad, options in ((True, False, False), (True, False, True), (False, True, True),
                                              (True, True, False)):  # fmt: skip
        compile_one(
            f"cross_entropy loss={compute_loss} grad={write_grad} options={options}",
            cross_entropy._cross_entropy_kernel,
            {
                "p_x": "*bf16",
                "p_target": "*i64",
                "p_loss": "*fp32",
                "p_lse": "*fp32",
                "p_scale": "*fp32",
                "p_dx": "*bf16",
                **dict.fromkeys(["n_cols", "stride_x_row", "stride_target", "stride_scale", "stride_dx_row"], "i32"),
                "ignore_index": "i32",
                **dict.fromkeys(["label_smoothing", "z_loss", "softcap"], "fp32"),
            },
            {
                "COMPUTE_LOSS": compute_loss,
                "WRITE_GRAD": write_grad,
                "HAS_SMOOTHING": options,
                "HAS_SOFTCAP": options,
                "BLOCK_N": cross_entropy.MAX_BLOCK_N,
            },
            num_warps=8,
        )
    return 0


def compile_puzzle_solutions():
    """The puzzles' reference kernels: `tritonkit puzzles check --device cuda` compiles the learner's."""
    rows = ["n_cols", "stride_x_row", "stride_out_row"]
    signatures = {
        1: ({"p_x": "*fp32", "p_y": "*fp32", "p_out": "*fp32", "n": "i32"}, {"BLOCK": 128}),
        2: ({"p_x": "*bf16", "p_y": "*bf16", "p_out": "*bf16", "n": "i32"}, {"BLOCK": 256}),
        3: ({"p_x": "*fp32", "p_y": "*fp32", "p_out": "*fp32", **dict.fromkeys(["m", "n", "stride_out_m"], "i32")},
            {"BLOCK_M": 16, "BLOCK_N": 32}),
        4: ({"p_img": "*fp32", "p_grey": "*fp32", "height": "i32", "width": "i32"}, {"BLOCK_H": 16, "BLOCK_W": 16}),
        5: ({"p_x": "*bf16", "p_out": "*fp32", "n_cols": "i32", "stride_x_row": "i32"}, {"BLOCK_N": 64}),
        6: ({"p_x": "*bf16", "p_out": "*fp32", "n_cols": "i32", "stride_x_row": "i32"}, {"BLOCK_N": 64}),
        7: ({"p_x": "*bf16", "p_out": "*bf16", **dict.fromkeys(rows, "i32")}, {"BLOCK_N": 64}),
        8: ({"p_x": "*bf16", "p_out": "*bf16", "n": "i32"}, {"BLOCK": 256}),
        9: ({**dict.fromkeys(["p_x", "p_w", "p_b", "p_out"], "*bf16"), **dict.fromkeys(rows, "i32"), "eps": "fp32"},
            {"BLOCK_N": 1024}),
        10: ({**dict.fromkeys(["p_x", "p_w", "p_out"], "*bf16"), **dict.fromkeys(rows, "i32"), "eps": "fp32"},
             {"BLOCK_N": 1024}),
        11: ({**dict.fromkeys(["p_a", "p_b", "p_c"], "*fp16"),
              **dict.fromkeys(["M", "N", "K", "stride_am", "stride_ak", "stride_bk", "stride_bn", "stride_cm",
                               "stride_cn"], "i32")},
             {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}),
        12: ({"p_x": "*i32", "p_counts": "*i32", "n": "i32"}, {"BLOCK": 128}),
        13: ({**dict.fromkeys(["p_q", "p_k", "p_v", "p_out"], "*fp16"),
              **dict.fromkeys(["seq_len", "stride_h", "stride_l"], "i32"), "scale": "fp32"},
             {"HEAD_DIM": 64, "BLOCK_M": 16, "BLOCK_N": 16}),
    }  # fmt: skip
    for puzzle in puzzles.all_puzzles():
        signature, constexprs = signatures[puzzle.number]
        kernel = getattr(importlib.import_module(puzzle.module), puzzle.kernel)
        compile_one(f"puzzle {puzzle.number} {puzzle.slug}", kernel, signature, constexprs)


if __name__ == "__main__":
    sys.exit(main())
