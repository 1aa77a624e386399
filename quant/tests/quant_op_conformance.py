"""torch.library conformance checks the quant test modules share (raw op cases in, assertions
out): opcheck and the mutation annotations of the schemas."""

import torch

# opcheck's test_schema compares tensors with arithmetic PyTorch lacks for float8_e4m3fn on the
# CPU ("mul_cpu_reduced_float" not implemented); cases with an fp8 tensor run the other three
# checks, and assert_only_declared_arguments_change covers what test_schema would (mutation).
FP8_OPCHECKS = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def opcheck_all(kernel, cases) -> None:
    """torch.library.opcheck of every (op name, args) case."""
    for name, args in cases:
        op = getattr(kernel.ops, name).default
        has_fp8 = any(isinstance(a, torch.Tensor) and a.dtype == torch.float8_e4m3fn for a in args)
        if has_fp8:
            torch.library.opcheck(op, args, test_utils=FP8_OPCHECKS)
        else:
            torch.library.opcheck(op, args)


def assert_only_declared_arguments_change(kernel, cases) -> None:
    """Arguments the schemas do not mark mutable (Tensor, not Tensor!) keep their bytes."""
    for name, args in cases:
        schema = getattr(kernel.ops, name).default._schema
        before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        getattr(kernel.ops, name)(*args)
        for arg, old, formal in zip(args, before, schema.arguments):
            mutable = formal.alias_info is not None and formal.alias_info.is_write
            if isinstance(arg, torch.Tensor) and not mutable:
                # reshape(-1): the bytes in logical order, whatever the strides
                same = torch.equal(
                    arg.reshape(-1).view(torch.uint8), old.reshape(-1).view(torch.uint8)
                )
                assert same, (name, formal)
