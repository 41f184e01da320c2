"""Paged decode attention: the Triton kernel (run by Triton's interpreter on CPU) against the torch
reference, and the reference against dense attention over each row's keys gathered one by one.

The interpreter only works when TRITON_INTERPRET=1 is set before triton is first imported, which another
test module may already have done, so the kernel cases run in a child process: this file run as a script.
"""

from __future__ import annotations

import inspect
import math
import os
import subprocess
import sys
from pathlib import Path

if __name__ == "__main__":
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402  (CI must have it: a missing triton fails here, it does not skip)

import pipelines.paged_attention as pa  # noqa: E402

POISON_K, POISON_V = 1e4, float("nan")  # a read of a slot that is not a visible key shows in the output


def make_case(lengths, hq, hkv, d, block_size, dtype=torch.float32, spare_blocks=3, seed=0):
    """Rows own scattered blocks of a shared pool; only visible keys hold data, the rest is poison."""
    g = torch.Generator().manual_seed(seed)
    need = [math.ceil(n / block_size) for n in lengths]
    num_blocks = sum(need) + spare_blocks
    max_blocks = max(need) + 1
    perm = torch.randperm(num_blocks, generator=g).tolist()
    table = torch.randint(-(2**30), 2**30, (len(lengths), max_blocks), generator=g, dtype=torch.int32)
    table[:, -1] = 0  # entries past a row's blocks: garbage or 0
    k = torch.full((num_blocks * block_size, hkv, d), POISON_K)
    v = torch.full((num_blocks * block_size, hkv, d), POISON_V)
    for r, n in enumerate(lengths):
        blocks = [perm.pop() for _ in range(need[r])]
        table[r, : need[r]] = torch.tensor(blocks, dtype=torch.int32)
        for i in range(n):
            slot = blocks[i // block_size] * block_size + i % block_size
            k[slot] = torch.randn(hkv, d, generator=g)
            v[slot] = torch.randn(hkv, d, generator=g)
    q = torch.randn(len(lengths), hq, d, generator=g)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    return q.to(dtype), k.to(dtype), v.to(dtype), table, seq_lens, 1 / math.sqrt(d), block_size


def dense_attention(q, k, v, table, seq_lens, scale, block_size):
    """Each row's keys gathered slot by slot into a contiguous run, then scaled_dot_product_attention."""
    out = torch.zeros(q.shape, dtype=torch.float32)
    for r, n in enumerate(seq_lens.tolist()):
        if n == 0:
            continue
        slots = [int(table[r, i // block_size]) * block_size + i % block_size for i in range(n)]
        keys, values = k[slots].float().transpose(0, 1)[None], v[slots].float().transpose(0, 1)[None]
        out[r] = torch.nn.functional.scaled_dot_product_attention(
            q[r].float()[None, :, None], keys, values, scale=scale, enable_gqa=True
        )[0, :, 0]
    return out


CASES = [  # lengths, hq, hkv, d, block_size, partition
    ([1, 15, 16, 17], 2, 2, 16, 16, 16),  # group 1; lengths 1, block_size - 1, block_size, +1
    ([0, 33, 100, 5], 4, 2, 32, 16, 32),  # group 2, a padding row, several partitions
    ([47, 0, 64, 129], 8, 1, 16, 32, 64),  # group 8, block_size 32
    ([77, 3], 8, 4, 16, 64, 16),  # partitions smaller than a block
    ([200, 3, 0], 16, 2, 16, 16, None),  # the default partition size
    ([0, 9, 31], 4, 1, 16, 16, 256),  # one partition: the first kernel writes the answer
    ([0, 0], 4, 2, 16, 16, 16),  # nothing but padding
]


def kernel_matches_reference(lengths, hq, hkv, d, block_size, partition):
    case = make_case(lengths, hq, hkv, d, block_size, seed=len(lengths) * 7 + hq)
    ref = pa.paged_decode_reference(*case)
    out = pa.paged_decode_triton(*case, partition=partition)
    assert out.shape == ref.shape and out.dtype == torch.float32
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for r, n in enumerate(lengths):
        if n == 0:
            assert (out[r] == 0).all()


def kernel_half_precision():  # fp16 only: the interpreter's tl.dot is wrong on bf16 (the GPU check runs bf16)
    case = make_case([40, 0, 17], 8, 2, 16, 16, dtype=torch.float16, seed=5)
    out = pa.paged_decode_triton(*case, partition=16)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float(), dense_attention(*case), rtol=2e-2, atol=2e-2)


def kernel_applies_scale():
    q, k, v, table, seq_lens, _, bs = make_case([30], 2, 1, 16, 16, seed=4)
    a = pa.paged_decode_triton(q, k, v, table, seq_lens, 0.05, bs, partition=16)
    b = pa.paged_decode_triton(q, k, v, table, seq_lens, 0.5, bs, partition=16)
    torch.testing.assert_close(a, pa.paged_decode_reference(q, k, v, table, seq_lens, 0.05, bs))
    assert not torch.allclose(a, b)


def run_kernel_cases() -> None:
    """The child's work: every kernel case, under the interpreter; the first failure names its case."""
    from triton.runtime.interpreter import InterpretedFunction

    assert isinstance(pa._partition_kernel, InterpretedFunction)
    for case in CASES:
        print("case", case, flush=True)
        kernel_matches_reference(*case)
    kernel_half_precision()
    kernel_applies_scale()
    print(f"{len(CASES) + 2} kernel cases passed ({'while' if pa.INTERPRET_WHILE else 'for'} loop)")


def test_kernel_matches_reference_in_interpreter():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    child = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stdout[-2000:] + child.stderr[-6000:]
    assert f"{len(CASES) + 2} kernel cases passed" in child.stdout


@pytest.mark.parametrize("lengths,hq,hkv,d,block_size,partition", CASES)
def test_reference_matches_dense(lengths, hq, hkv, d, block_size, partition):
    case = make_case(lengths, hq, hkv, d, block_size, seed=len(lengths) + hq)
    ref = pa.paged_decode_reference(*case)
    torch.testing.assert_close(ref, dense_attention(*case), rtol=1e-5, atol=1e-5)


def test_dispatch_on_cpu_is_the_reference():
    case = make_case([20, 0, 5], 4, 2, 16, 16, seed=3)
    assert torch.equal(pa.paged_decode_attention(*case), pa.paged_decode_reference(*case))


def test_bad_inputs_are_refused():  # refused before any launch
    q, k, v, table, seq_lens, scale, bs = make_case([20, 5], 4, 2, 16, 16)
    with pytest.raises(ValueError, match="multiple"):
        pa.paged_decode_reference(q[:, :3], k, v, table, seq_lens, scale, bs)
    with pytest.raises(ValueError, match="int32"):
        pa.paged_decode_triton(q, k, v, table.long(), seq_lens, scale, bs)
    with pytest.raises(ValueError, match="block_table"):
        pa.paged_decode_triton(q, k, v, table[:1], seq_lens, scale, bs)
    with pytest.raises(ValueError, match="head dim"):
        pa.paged_decode_reference(q, k[..., :8], v[..., :8], table, seq_lens, scale, bs)
    with pytest.raises(ValueError, match="power of two"):
        pa.paged_decode_triton(q, k, v, table, seq_lens, scale, bs, partition=24)
    with pytest.raises(ValueError, match="exceed"):
        pa.paged_decode_reference(q, k, v, table, torch.tensor([20, 999], dtype=torch.int32), scale, bs)


def compile_for_hopper(kernel, pointers: dict[str, str], consts: dict) -> object:
    """Compiles a kernel to an sm_90 cubin on this CPU machine, with the JIT's 16-divisibility hints."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(inspect.signature(kernel.fn).parameters)
    sig = {n: pointers.get(n, "constexpr" if n in consts else "fp32" if n == "scale_log2" else "i32") for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if sig[n] not in ("constexpr", "fp32")}
    src = ASTSource(kernel, sig, {(names.index(k),): v for k, v in consts.items()}, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})


@pytest.mark.parametrize("num_parts", [1, 8])
def test_kernels_compile_for_hopper(num_parts):
    """The GPU path cannot run here, but Triton's compiler and ptxas can: the thinker's bf16 shapes."""
    ptrs = {f"{n}_ptr": "*bf16" for n in ("q", "k", "v", "out")}
    ptrs |= {"bt_ptr": "*i32", "len_ptr": "*i32", "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32"}
    consts = dict(GROUP=8, GROUP_PAD=16, D=128, D_PAD=128, BLOCK_SIZE=16, MAX_BLOCKS=256, PART=512, TILE_N=pa.TILE,
                  NUM_PARTS=num_parts, PRECISION="tf32", LOOP_WHILE=False)
    compiled = compile_for_hopper(pa._partition_kernel, ptrs, consts)
    assert "mma.sync" in compiled.asm["ptx"] and compiled.asm["cubin"]
    if num_parts > 1:
        merge = dict(D=128, D_PAD=128, CONTEXT=4096, PART=512, NUM_PARTS=num_parts, PARTS_PAD=num_parts)
        assert compile_for_hopper(pa._merge_kernel, ptrs, merge).asm["cubin"]


if __name__ == "__main__":
    run_kernel_cases()
