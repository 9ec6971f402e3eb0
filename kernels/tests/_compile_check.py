"""Compile every Triton kernel for sm_90 without a GPU (run by test_gpu_compile.py).

Runs in a fresh process WITHOUT TRITON_INTERPRET (the interpreter replaces the JIT
functions).  Prints one line per kernel variant and exits 1 if any failed.
"""

from __future__ import annotations

import sys
import traceback

import lightspec_kernels.chain as cv  # noqa: E402
import lightspec_kernels.confidence as cs  # noqa: E402
import lightspec_kernels.kv_compact as ck  # noqa: E402
import lightspec_kernels.tree as tv  # noqa: E402
import lightspec_kernels.tree_mask as tm  # noqa: E402
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

P = "*fp32"


def _cases():
    for dt in ("fp32", "bf16", "fp16"):
        for k in (0, 16):
            for split in (False, True):
                yield (
                    "confidence",
                    cs._confidence_kernel,
                    dict(
                        x_ptr=f"*{dt}",
                        stride_row="i64",
                        V="i32",
                        inv_temp="fp32",
                        maxp_ptr=P,
                        ent_ptr=P,
                        lse_ptr=P,
                        ids_ptr="*i64",
                        probs_ptr=P,
                        part_ptr=P,
                        pv_ptr=P,
                        pi_ptr="*i32",
                        CHUNK="i32",
                    ),
                    dict(TOP_K=k, KP=max(k, 2), BLOCK_V=4096, SPLIT=split),
                    {},
                )
    for k in (0, 5):
        yield (
            "confidence_combine",
            cs._confidence_combine_kernel,
            dict(
                inv_temp="fp32",
                maxp_ptr=P,
                ent_ptr=P,
                lse_ptr=P,
                ids_ptr="*i64",
                probs_ptr=P,
                part_ptr=P,
                pv_ptr=P,
                pi_ptr="*i32",
                S="i32",
            ),
            dict(SP=64, TOP_K=k, KP=max(k, 8)),
            {},
        )
    yield (
        "chain_argmax",
        cv._chain_argmax_kernel,
        dict(
            tp_ptr="*bf16",
            s_tb="i64",
            s_tk="i64",
            lens_ptr="*i64",
            pv_ptr=P,
            pi_ptr="*i32",
            K="i32",
            V="i32",
            CHUNK="i32",
        ),
        dict(BLOCK_V=4096),
        {},
    )
    yield (
        "chain_greedy_finish",
        cv._chain_greedy_finish_kernel,
        dict(
            dt_ptr="*i64",
            s_db="i64",
            lens_ptr="*i64",
            pv_ptr=P,
            pi_ptr="*i32",
            acc_ptr="*i64",
            out_ptr="*i64",
            K="i32",
            S="i32",
        ),
        dict(KP1=32, SP=64),
        {},
    )
    accept = dict(
        dt_ptr="*i64",
        s_db="i64",
        lens_ptr="*i64",
        tp_ptr=P,
        s_tb="i64",
        s_tk="i64",
        dp_ptr=P,
        s_qb="i64",
        s_qk="i64",
        u_ptr=P,
        s_ub="i64",
    )
    for has_q in (False, True):
        for split in (False, True):
            yield (
                "chain_sample",
                cv._chain_sample_kernel,
                dict(
                    **accept,
                    e_ptr=P,
                    s_eb="i64",
                    acc_ptr="*i64",
                    out_ptr="*i64",
                    pv_ptr=P,
                    pi_ptr="*i32",
                    K="i32",
                    V="i32",
                    CHUNK="i32",
                ),
                dict(HAS_Q=has_q, KP1=32, BLOCK_V=4096, SPLIT=split),
                {},
            )
        yield (
            "chain_sample_finish",
            cv._chain_sample_finish_kernel,
            dict(
                **accept,
                acc_ptr="*i64",
                out_ptr="*i64",
                pv_ptr=P,
                pi_ptr="*i32",
                K="i32",
                S="i32",
            ),
            dict(HAS_Q=has_q, KP1=32, SP=64),
            {},
        )
    for sample, has_q, pre in ((False, False, False), (False, False, True), (True, False, False), (True, True, False)):
        yield (
            "tree_verify",
            tv._tree_verify_kernel,
            dict(
                tok_ptr="*i64",
                s_tok="i64",
                par_ptr="*i64",
                s_par="i64",
                tp_ptr="*bf16",
                s_tb="i64",
                s_tn="i64",
                dp_ptr="*bf16",
                s_qb="i64",
                s_qn="i64",
                u_ptr=P,
                s_ub="i64",
                e_ptr=P,
                s_eb="i64",
                ws_ptr=P,
                path_ptr="*i64",
                plen_ptr="*i64",
                bonus_ptr="*i64",
                pv_ptr=P,
                pi_ptr="*i32",
                N="i32",
                V="i32",
                S="i32",
            ),
            dict(SAMPLE=sample, PRE_ARGMAX=pre, SP=64, HAS_Q=has_q, NP=64, BLOCK_V=8192),
            {"enable_fp_fusion": False, "num_warps": 16},
        )
    for from_table in (False, True):
        yield (
            "compact_kv",
            ck._compact_kv_kernel,
            dict(
                c_ptr="*i64" if from_table else "*bf16",
                table_ptr="*i64",
                s_b="i64",
                s_h="i64",
                s_t="i64",
                s_d="i64",
                keep_ptr="*i64",
                s_kb="i64",
                dst_ptr="*i64",
                BH="i32",
                H="i32",
                M="i32",
                D="i32",
            ),
            dict(MP=64, BLOCK_D=128, FROM_TABLE=from_table, ELEM=tl.bfloat16),
            {"num_warps": 4},
        )
    for mdt, is_bool in (("*i1", True), ("*bf16", False)):
        yield (
            "tree_mask",
            tm._tree_mask_kernel,
            dict(
                par_ptr="*i64",
                s_pb="i64",
                mask_ptr=mdt,
                pos_ptr="*i64",
                N="i32",
                prefix_len="i32",
                min_val="fp32",
            ),
            dict(IS_BOOL=is_bool, NP=64, BLOCK_C=128),
            {},
        )


def main() -> int:
    failed = 0
    for i, (name, fn, sig, constexprs, opts) in enumerate(_cases()):
        signature = dict(sig)
        signature.update({k: "constexpr" for k in constexprs})
        try:
            src = ASTSource(fn, signature, constexprs=constexprs)
            compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, **opts})
            assert len(compiled.asm["cubin"]) > 0
            print(f"ok {name}-{i} {constexprs}")
        except Exception:  # noqa: BLE001
            failed += 1
            print(f"FAIL {name}-{i} {constexprs}\n{traceback.format_exc()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
