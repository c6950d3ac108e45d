"""torch's type promotion over nbxcert's dtypes (kernels/promotion.py), against tables written out from torch's
documentation: the full torch.promote_types table, torch.result_type's examples (zero-dim tensors, Python scalars),
the per-kind results of elementwise_dtypes, torch.can_cast, and the one-line errors."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from nbxcert import cli
from nbxcert.errors import CastRefused, DTypeError, DTypeNotSupported
from nbxcert.kernels import promotion as P
from nbxcert.kernels import tensor as T

# torch.promote_types over bool, uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64 (c10's
# promotion lookup table, as the type promotion docs state it): row dtype promoted with column dtype.
ORDER = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64")
_ABBREV = {"b1": "bool", "u1": "uint8", "i1": "int8", "i2": "int16", "i4": "int32", "i8": "int64"}
_ABBREV.update({"f2": "float16", "bf": "bfloat16", "f4": "float32", "f8": "float64"})
TABLE_TEXT = """
     b1 u1 i1 i2 i4 i8 f2 bf f4 f8
b1   b1 u1 i1 i2 i4 i8 f2 bf f4 f8
u1   u1 u1 i2 i2 i4 i8 f2 bf f4 f8
i1   i1 i2 i1 i2 i4 i8 f2 bf f4 f8
i2   i2 i2 i2 i2 i4 i8 f2 bf f4 f8
i4   i4 i4 i4 i4 i4 i8 f2 bf f4 f8
i8   i8 i8 i8 i8 i8 i8 f2 bf f4 f8
f2   f2 f2 f2 f2 f2 f2 f2 f4 f4 f8
bf   bf bf bf bf bf bf f4 bf f4 f8
f4   f4 f4 f4 f4 f4 f4 f4 f4 f4 f8
f8   f8 f8 f8 f8 f8 f8 f8 f8 f8 f8
"""


def _table() -> dict[tuple[str, str], str]:
    lines = TABLE_TEXT.strip().splitlines()
    cols = [_ABBREV[c] for c in lines[0].split()]
    table = {}
    for line in lines[1:]:
        row, *cells = line.split()
        for col, cell in zip(cols, cells, strict=True):
            table[(_ABBREV[row], col)] = _ABBREV[cell]
    return table


TABLE = _table()


def test_the_written_table_is_complete_and_symmetric():
    assert len(TABLE) == 100
    assert all(TABLE[(a, b)] == TABLE[(b, a)] for a in ORDER for b in ORDER)


@pytest.mark.parametrize("a", ORDER)
def test_promote_types_is_torchs_table(a):
    got = {b: P.promote_types(a, b) for b in ORDER}
    assert got == {b: TABLE[(a, b)] for b in ORDER}


def test_promote_types_takes_aliases_and_refuses_float8_and_unknown_names():
    assert P.promote_types("fp16", "bf16") == "float32"
    with pytest.raises(DTypeNotSupported, match="promote_types: type promotion of float8_e4m3fn is not supported"):
        P.promote_types("float8_e4m3fn", "float32")
    with pytest.raises(DTypeNotSupported, match="float8_e5m2"):
        P.promote_types("int8", "float8_e5m2")
    with pytest.raises(DTypeError, match="unknown dtype 'complex64'"):
        P.promote_types("complex64", "float32")


def t(dtype: str, *shape: int) -> T.Tensor:
    """A tensor of `dtype` and `shape` (no shape: zero-dim)."""
    return T.empty(shape, dtype)


# torch.result_type and the type promotion docs' examples, as (operands, result)
RESULT_TYPE_EXAMPLES = [
    # torch.result_type docs
    ((t("int32", 2), 1.0), "float32"),
    ((t("uint8", 2), t("int64")), "uint8"),
    # the type promotion docs: "5 is an int64, but does not have higher category than int_tensor so is not considered"
    ((5, 5), "int64"),
    ((t("int32", 1), 5), "int32"),
    ((t("int32", 1), t("int64")), "int32"),
    ((t("int64", 1), t("int32", 1)), "int64"),
    ((t("bool", 1), t("int64", 1)), "int64"),
    ((t("bool", 1), t("uint8", 1)), "uint8"),
    ((t("float32", 1), t("float64", 1)), "float64"),
    ((t("bool", 1), t("int32", 1)), "int32"),
    ((t("int64", 1), t("float32", 1)), "float32"),  # a float only needs to be large enough to hold the float
    # a lower-priority participant of a higher category sets the result to its own dtype
    ((t("int32", 1), t("float16")), "float16"),
    ((t("int64", 3), t("float64")), "float64"),
    ((t("float16", 3), t("float64")), "float16"),  # same category: the dimensioned tensor wins
    ((t("float16", 3), 1.5), "float16"),
    ((t("bfloat16", 3), 2), "bfloat16"),
    ((t("uint8", 3), -1), "uint8"),  # no value-based promotion: the scalar's sign does not matter
    ((t("bool", 3), 5), "int64"),  # bool tensor + int: int64 (the scalar's category is higher)
    ((t("bool", 3), 2.5), "float32"),  # the default float dtype
    ((t("bool", 3), True), "bool"),
    ((t("int8", 3), t("uint8", 3)), "int16"),
    ((t("int8"), t("uint8")), "int16"),  # zero-dim tensors alone promote among themselves
    ((t("int8"), 7), "int8"),
    ((t("bool"), 7), "int64"),
    ((t("int16"), 7.0), "float32"),
    ((t("float16"), t("bfloat16")), "float32"),
    ((t("int32", 2), t("float16"), 1.0), "float16"),  # the zero-dim float outranks the scalar's default float
    ((t("int32", 2), t("int64"), 1.0), "float32"),
    ((True, False), "bool"),
    ((True, 2), "int64"),
    ((2, 2.0), "float32"),
]


@pytest.mark.parametrize(("operands", "expected"), RESULT_TYPE_EXAMPLES)
def test_result_type_matches_torchs_examples(operands, expected):
    assert P.result_type(*operands) == expected


def test_result_type_refuses_what_is_not_an_operand():
    with pytest.raises(DTypeNotSupported, match="result_type: an operand of type str"):
        P.result_type(t("float32", 2), "1.0")
    with pytest.raises(DTypeNotSupported, match="result_type: an operand of type complex"):
        P.result_type(t("float32", 2), 1j)
    with pytest.raises(DTypeNotSupported, match="needs at least one operand"):
        P.result_type()
    with pytest.raises(DTypeNotSupported, match="float8_e4m3fn"):
        P.result_type(t("float8_e4m3fn", 2), 1.0)


# elementwise_dtypes: (operands, kind, (computation dtype, result dtype)) from torch._prims_common's kinds
ELEMENTWISE_EXAMPLES = [
    ((t("float16", 4), t("float16", 4)), "default", ("float32", "float16")),
    ((t("bfloat16", 4), 2.0), "default", ("float32", "bfloat16")),
    ((t("float32", 4), t("float64")), "default", ("float32", "float32")),
    ((t("int32", 4), t("int64", 4)), "default", ("int64", "int64")),
    ((t("bool", 4), t("bool", 4)), "default", ("bool", "bool")),
    ((t("int32", 4),), "int_to_float", ("float32", "float32")),  # exp of an integer tensor: float32
    ((t("bool", 4),), "int_to_float", ("float32", "float32")),
    ((t("int64", 4), t("int64", 4)), "int_to_float", ("float32", "float32")),  # true division of integers
    ((t("float16", 4),), "int_to_float", ("float32", "float16")),
    ((t("float64", 4),), "int_to_float", ("float64", "float64")),
    ((t("float16", 4), t("float16", 4)), "always_bool", ("float32", "bool")),  # comparisons
    ((t("int8", 4), t("uint8", 4)), "always_bool", ("int16", "bool")),
    ((t("int32", 4), 1.5), "always_bool", ("float32", "bool")),
    ((t("bool", 4), t("bool", 4)), "bool_to_long", ("int64", "int64")),  # sum-like ops
    ((t("int8", 4),), "bool_to_long", ("int8", "int8")),
    ((t("bfloat16", 4),), "bool_to_long", ("float32", "bfloat16")),
    ((t("float16", 4), t("float16", 4)), "no_opmath", ("float16", "float16")),  # copies, selections
    ((t("bool", 4), t("int8", 4)), "no_opmath", ("int8", "int8")),
]


@pytest.mark.parametrize(("operands", "kind", "expected"), ELEMENTWISE_EXAMPLES)
def test_elementwise_dtypes_per_kind(operands, kind, expected):
    assert P.elementwise_dtypes(*operands, kind=kind) == expected


def test_elementwise_dtypes_refuses_an_unknown_kind():
    with pytest.raises(ValueError, match="kind must be one of default, int_to_float"):
        P.elementwise_dtypes(t("float32", 2), kind="complex_to_float")


def test_can_cast_is_torchs_category_rule():
    """torch.can_cast docs: can_cast(double, float) is True, can_cast(float, int) is False; a result may go to the
    same or a higher category, never to a lower one."""
    assert P.can_cast("float64", "float32")
    assert not P.can_cast("float32", "int32")
    for a in ORDER:
        for b in ORDER:
            expected = P.category(b) >= P.category(a)
            assert P.can_cast(a, b) is expected, (a, b)
    assert P.can_cast("int64", "int8") and P.can_cast("uint8", "int8") and P.can_cast("int8", "uint8")
    assert P.can_cast("bool", "float16") and not P.can_cast("int8", "bool") and not P.can_cast("float16", "bool")
    assert P.can_cast("float8_e4m3fn", "float32") and not P.can_cast("float8_e5m2", "int32")


def test_categories():
    assert [P.category(d) for d in ORDER] == [0, 1, 1, 1, 1, 1, 2, 2, 2, 2]


def test_check_cast_refuses_in_one_line_naming_op_and_dtypes():
    P.check_cast("add", "int32", "float16")  # allowed: no error
    with pytest.raises(CastRefused) as e:
        P.check_cast("add_", "float32", "int64")
    assert str(e.value) == "add_: result type float32 can't be cast to the output type int64"
    line = cli.error_line(e.value)
    assert "\n" not in line and line.startswith("nbxcert: cast refused: add_: result type float32")


def test_check_dtype_refuses_in_one_line_naming_op_dtype_and_what_it_takes():
    P.check_dtype("bitwise_and", "int8", "bi")
    P.check_dtype("bitwise_and", "bool", "bi")
    with pytest.raises(DTypeNotSupported) as e:
        P.check_dtype("bitwise_and", "float32", "bi")
    assert str(e.value) == ("bitwise_and: does not take dtype float32; it takes bool, uint8, int8, int16, int32, int64")
    line = cli.error_line(e.value)
    assert "\n" not in line and line.startswith("nbxcert: dtype not supported: bitwise_and: does not take")
    with pytest.raises(DTypeNotSupported, match="exp: does not take dtype int32; it takes float16, bfloat16"):
        P.check_dtype("exp", "int32", "f")
    with pytest.raises(DTypeNotSupported, match="float8_e4m3fn"):
        P.check_dtype("exp", "float8_e4m3fn", "f")


def test_every_error_class_has_a_cli_label():
    assert cli.ERROR_TABLE[DTypeNotSupported] == "dtype not supported"
    assert cli.ERROR_TABLE[CastRefused] == "cast refused"


def test_numpy_tensors_read_as_tensors_and_no_torch():
    x = T.from_numpy(np.ones((2, 3), dtype=np.float16))
    assert P.result_type(x, 2) == "float16"
    assert "torch" not in sys.modules
