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
cross_entropy = importlib.import_module("tritonkit.ops.cross_entropy")
HOPPER = GPUTarget("cuda", 90, 32)


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
            {
                "BLOCK_M": 128,
                "BLOCK_N": 128,
                "BLOCK_K": 64,
                "GROUP_SIZE": 8,
                "INPUT_PRECISION": precision,
                "UPCAST": False,
            },
            num_warps=8,
            num_stages=3,
        )
    for single_pass, block_n, rows in ((True, 4096, 2), (False, 4096, 1)):
        for is_rms in (True, False):
            flags = {"IS_RMS": is_rms, "HAS_RES": True, "HAS_W": True, "HAS_B": not is_rms}
            compile_one(
                f"norm fwd rms={is_rms} single={single_pass}",
                norm._norm_fwd_kernel,
                {
                    **dict.fromkeys(["p_x", "p_res", "p_w", "p_b", "p_y", "p_h"], "*bf16"),
                    "p_mean": "*fp32",
                    "p_rstd": "*fp32",
                    **dict.fromkeys(
                        ["n_rows", "n_cols", "stride_x_row", "stride_res_row", "stride_y_row", "stride_h_row"], "i32"
                    ),
                    "eps": "fp32",
                    "offset": "fp32",
                },
                {**flags, "STORE_H": True, "SINGLE_PASS": single_pass, "ROWS": rows, "BLOCK_N": block_n},
                num_warps=8,
            )
            compile_one(
                f"norm bwd rms={is_rms} single={single_pass}",
                norm._norm_bwd_kernel,
                {
                    **dict.fromkeys(["p_dy", "p_dh", "p_x", "p_res", "p_w"], "*bf16"),
                    "p_mean": "*fp32",
                    "p_rstd": "*fp32",
                    "p_dx": "*bf16",
                    "p_dres": "*fp32",
                    "p_dw_part": "*fp32",
                    "p_db_part": "*fp32",
                    **dict.fromkeys(
                        [
                            "n_rows",
                            "n_cols",
                            "rows_per_program",
                            "stride_dy_row",
                            "stride_dh_row",
                            "stride_x_row",
                            "stride_res_row",
                            "stride_dx_row",
                            "stride_dres_row",
                        ],
                        "i32",
                    ),
                    "offset": "fp32",
                },
                {**flags, "HAS_DH": True, "STORE_DRES": True, "SINGLE_PASS": single_pass, "BLOCK_N": block_n},
                num_warps=8,
            )
    for single_pass, block_n, rows in ((True, 1024, 4), (False, 4096, 1)):
        for log in (False, True):
            constexprs = {"LOG": log, "SINGLE_PASS": single_pass, "ROWS": rows, "BLOCK_N": block_n}
            compile_one(
                f"softmax fwd log={log} single={single_pass}",
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
                constexprs,
                num_warps=8,
            )
            compile_one(
                f"softmax bwd log={log} single={single_pass}",
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


if __name__ == "__main__":
    sys.exit(main())
