"""`nbxcert.ops`: nbxcert's kernels under torch's names and signatures, in one namespace (`from nbxcert import ops`).

Every pointwise op of torch (`torch.add`, `torch.exp`, `torch.where`, ...) and of `torch.nn.functional` (`gelu`,
`silu`, `leaky_relu`, `logsigmoid` and `log_sigmoid`, `glu`, ...) takes torch's positional and keyword arguments,
broadcasts its operands, takes Python numbers as operands, promotes as torch does (`nbxcert.kernels.promotion`),
writes `out=` (any strides) and has its in-place `_` form where torch has one (`add_`, `relu_`, `clamp_`, ...).
Data movement: `zeros`, `ones`, `full`, `arange`, `linspace`, `copy_`, `fill_`, `to`. All run one certified kernel,
`nbxcert.kernels.pointwise`. The other families are here under torch-like names too (`matmul`, `bmm`, `softmax`,
`rms_norm`, `layer_norm`, `embedding`, `scaled_dot_product_attention`, ...).

Importing this module imports no kernel (each is loaded on its first use) and never torch. Errors are one line:
`DTypeError` (a dtype the op does not take, a result that `out=` cannot hold), `ShapeMismatch` (shapes that do not
broadcast, an `out=` of the wrong shape), `LaunchError` (an integer division by zero, a float to integer cast of
NaN or out of range).
"""

from __future__ import annotations

import importlib
import math
from typing import Any

from nbxcert.errors import DTypeError, ShapeMismatch

_FAMILIES = {
    # torch-like name -> (kernel family module, its function)
    "matmul": ("matmul", "matmul"),
    "mm": ("matmul", "matmul"),
    "addmm": ("matmul", "addmm"),
    "bmm": ("matmul", "bmm"),
    "baddbmm": ("matmul", "baddbmm"),
    "mv": ("matmul", "gemv"),
    "addmv": ("matmul", "addmv"),
    "softmax": ("rows", "softmax"),
    "layer_norm": ("rows", "layernorm"),
    "rms_norm": ("rows", "rmsnorm"),
    "add_layer_norm": ("rows", "add_layernorm"),
    "add_rms_norm": ("rows", "add_rmsnorm"),
    "log_softmax": ("sampling", "log_softmax"),
    "argmax": ("sampling", "argmax"),
    "topk": ("sampling", "topk"),
    "cross_entropy": ("sampling", "cross_entropy"),
    "silu_and_mul": ("elementwise", "silu_and_mul"),
    "embedding": ("elementwise", "embedding"),
    "rope": ("elementwise", "rope"),
    "rotary_embedding": ("elementwise", "rope"),
    "scaled_dot_product_attention": ("attention", "flash_attention"),
    "flash_attention": ("attention", "flash_attention"),
    "decode_attention": ("attention", "decode_attention"),
    "paged_decode_attention": ("attention", "paged_decode_attention"),
    "fused_moe": ("moe", "fused_moe"),
    "conv2d": ("vision", "conv2d"),
    "group_norm": ("vision", "group_norm"),
    "upsample_nearest2d": ("vision", "upsample_nearest2d"),
    "dequant_matmul": ("quant", "dequant_matmul"),
    "dequant_gemv": ("quant", "dequant_gemv"),
}


def __getattr__(name: str):
    """The other kernel families' entry points, loaded on first use."""
    if name in _FAMILIES:
        module, attr = _FAMILIES[name]
        fn = getattr(importlib.import_module(f"nbxcert.kernels.{module}"), attr)
        globals()[name] = fn
        return fn
    raise AttributeError(f"module 'nbxcert.ops' has no attribute '{name}'")


def _pw():
    return importlib.import_module("nbxcert.kernels.pointwise")


def _tensor_type():
    return importlib.import_module("nbxcert.kernels.tensor").Tensor


_CATEGORY = {"bool": 0, "uint8": 1, "int8": 1, "int16": 1, "int32": 1, "int64": 1}


def _category(dtype: str) -> int:
    return _CATEGORY.get(dtype, 2)


def _can_cast(result: str, to: str) -> bool:
    """torch.can_cast: never a float into an integer or bool, never a number into bool."""
    return _category(result) <= _category(to)


def _is_number(v: Any) -> bool:
    return isinstance(v, (bool, int, float)) and not isinstance(v, type)


def _apply(name: str, operands: list, params: dict | None = None, out=None, promote_params: tuple = ()) -> Any:
    """Run pointwise op `name` on `operands` (tensors or Python numbers) with `params`, into `out` (allocated when
    None): promotion, dtype and shape checks, then the served launch."""
    pw = _pw()
    Tensor = _tensor_type()
    op = pw.OPS[name]
    params = dict(params or {})
    for v in operands:
        if not (isinstance(v, Tensor) or _is_number(v)):
            raise DTypeError(f"{op.name}: an operand of type {type(v).__name__} is neither a Tensor nor a number")
    tensors = [t for t in operands if isinstance(t, Tensor)]
    if not tensors and out is None:
        raise DTypeError(f"{op.name}: at least one operand must be a Tensor")
    shape = pw.broadcast_shapes(*(t.shape for t in tensors)) if tensors else tuple(out.shape)
    device = tensors[0].device if tensors else out.device
    fixed = op.operand_dtypes
    participants = [v for i, v in enumerate(operands) if not (i < len(fixed) and fixed[i])]
    participants += [params[p] for p in promote_params if params.get(p) is not None]
    for i, v in enumerate(operands):
        if i < len(fixed) and fixed[i] and isinstance(v, Tensor) and v.dtype.name != fixed[i]:
            raise DTypeError(f"{op.name}: operand {i} must be {fixed[i]}, got {v.dtype.name}")
    promotion = pw.promotion()
    _, result = promotion.elementwise_dtypes(*participants, kind=op.kind)
    common = promotion.result_type(*participants) if op.kind == "always_bool" else result
    if op.kind == "int_to_float" and common not in pw.FLOATS:
        common = "float32"
    pw.check_dtype(op, common)
    if out is None:
        out = pw.empty(shape, result, device)
    else:
        if not isinstance(out, Tensor):
            raise DTypeError(f"{op.name}: out must be a Tensor, got {type(out).__name__}")
        if tuple(out.shape) != tuple(shape):
            raise ShapeMismatch(f"{op.name}: out has shape {tuple(out.shape)}, the result's is {tuple(shape)}")
        if not _can_cast(result, out.dtype.name):
            raise DTypeError(
                f"{op.name}: result type {result} can't be cast to the desired output type {out.dtype.name}"
            )
    via, compute, kparams, p_float = pw.plan_for(op, operands, common, out, params)
    padded = list(operands) + [None] * (3 - len(operands))
    return pw.pointwise_call(name, *padded, out, via, compute, kparams, p_float)


def _inplace(name: str, self, operands: list, params: dict | None = None, promote_params: tuple = ()):
    """The in-place form: the result written into `self` (its shape must be the broadcast shape)."""
    return _apply(name, operands, params, out=self, promote_params=promote_params)


# ======================================================================================================================
# unary math
# ======================================================================================================================
def _unary(name: str, doc: str):
    def fn(input, *, out=None):
        return _apply(name, [input], out=out)

    def fn_(input):
        return _inplace(name, input, [input])

    fn.__name__, fn.__qualname__, fn.__doc__ = name, name, doc
    fn_.__name__, fn_.__qualname__, fn_.__doc__ = name + "_", name + "_", f"In-place {name}."
    return fn, fn_


abs, abs_ = _unary("abs", "|input|, element-wise (torch.abs; abs(INT_MIN) wraps to INT_MIN).")
absolute = abs
neg, neg_ = _unary("neg", "-input (torch.neg).")
negative = neg
exp, exp_ = _unary("exp", "e^input (torch.exp).")
exp2, exp2_ = _unary("exp2", "2^input (torch.exp2).")
expm1, expm1_ = _unary("expm1", "e^input - 1 (torch.expm1).")
log, log_ = _unary("log", "natural logarithm (torch.log).")
log2, log2_ = _unary("log2", "base-2 logarithm (torch.log2).")
log1p, log1p_ = _unary("log1p", "log(1 + input) (torch.log1p).")
sqrt, sqrt_ = _unary("sqrt", "square root (torch.sqrt).")
rsqrt, rsqrt_ = _unary("rsqrt", "1 / sqrt(input) (torch.rsqrt).")
reciprocal, reciprocal_ = _unary("reciprocal", "1 / input (torch.reciprocal).")
sin, sin_ = _unary("sin", "sine (torch.sin).")
cos, cos_ = _unary("cos", "cosine (torch.cos).")
tan, tan_ = _unary("tan", "tangent (torch.tan).")
tanh, tanh_ = _unary("tanh", "hyperbolic tangent (torch.tanh).")
erf, erf_ = _unary("erf", "error function (torch.erf).")
sign, sign_ = _unary("sign", "-1, 0 or 1 by the sign of input (torch.sign).")
floor, floor_ = _unary("floor", "floor (torch.floor).")
ceil, ceil_ = _unary("ceil", "ceiling (torch.ceil).")
trunc, trunc_ = _unary("trunc", "rounded toward zero (torch.trunc).")
fix = trunc
sigmoid, sigmoid_ = _unary("sigmoid", "1 / (1 + e^-input) (torch.sigmoid).")
logical_not, _ = _unary("logical_not", "input == 0 (torch.logical_not).")
bitwise_not, bitwise_not_ = _unary("bitwise_not", "~input (torch.bitwise_not; logical not of a bool).")
isnan, _ = _unary("isnan", "input is NaN (torch.isnan).")
isinf, _ = _unary("isinf", "input is +-inf (torch.isinf).")
isfinite, _ = _unary("isfinite", "input is finite (torch.isfinite).")


def round(input, *, decimals: int = 0, out=None):  # noqa: A001 - torch's name
    """Rounded half to even (torch.round); decimals other than 0 are refused."""
    if decimals != 0:
        raise DTypeError(f"round: decimals={decimals} is not supported (only 0)")
    return _apply("round", [input], out=out)


def round_(input, *, decimals: int = 0):
    return round(input, decimals=decimals, out=input)


# ======================================================================================================================
# binary arithmetic
# ======================================================================================================================
def add(input, other, *, alpha=1, out=None):
    """input + alpha * other (torch.add)."""
    return _apply("add", [input, other], {"alpha": alpha}, out=out)


def add_(input, other, *, alpha=1):
    return add(input, other, alpha=alpha, out=input)


def sub(input, other, *, alpha=1, out=None):
    """input - alpha * other (torch.sub)."""
    return _apply("sub", [input, other], {"alpha": alpha}, out=out)


def sub_(input, other, *, alpha=1):
    return sub(input, other, alpha=alpha, out=input)


subtract = sub


def rsub(input, other, *, alpha=1, out=None):
    """other - alpha * input (torch.rsub)."""
    return _apply("sub", [other, input], {"alpha": alpha}, out=out)


def mul(input, other, *, out=None):
    """input * other (torch.mul)."""
    return _apply("mul", [input, other], out=out)


def mul_(input, other):
    return mul(input, other, out=input)


multiply = mul

_ROUNDING = {None: "div", "trunc": "div_trunc", "floor": "div_floor"}


def div(input, other, *, rounding_mode=None, out=None):
    """input / other (torch.div): true division, or rounded "trunc" / "floor"."""
    if rounding_mode not in _ROUNDING:
        raise DTypeError(f"div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
    return _apply(_ROUNDING[rounding_mode], [input, other], out=out)


def div_(input, other, *, rounding_mode=None):
    return div(input, other, rounding_mode=rounding_mode, out=input)


divide = true_divide = div


def floor_divide(input, other, *, out=None):
    """floor(input / other) (torch.floor_divide)."""
    return _apply("div_floor", [input, other], out=out)


def _binary(name: str, doc: str, inplace: bool = True):
    def fn(input, other, *, out=None):
        return _apply(name, [input, other], out=out)

    def fn_(input, other):
        return _apply(name, [input, other], out=input)

    fn.__name__, fn.__qualname__, fn.__doc__ = name, name, doc
    fn_.__name__, fn_.__qualname__, fn_.__doc__ = name + "_", name + "_", f"In-place {name}."
    return fn, (fn_ if inplace else None)


remainder, remainder_ = _binary("remainder", "input mod other with the divisor's sign (torch.remainder).")
fmod, fmod_ = _binary("fmod", "C's fmod: the remainder with the dividend's sign (torch.fmod).")
maximum, _ = _binary("maximum", "element-wise maximum, NaN propagating (torch.maximum).", False)
minimum, _ = _binary("minimum", "element-wise minimum, NaN propagating (torch.minimum).", False)
atan2, atan2_ = _binary("atan2", "atan2(input, other) (torch.atan2).")
arctan2 = atan2
hypot, hypot_ = _binary("hypot", "sqrt(input^2 + other^2) (torch.hypot).")
eq, eq_ = _binary("eq", "input == other (torch.eq).")
ne, ne_ = _binary("ne", "input != other (torch.ne).")
lt, lt_ = _binary("lt", "input < other (torch.lt).")
le, le_ = _binary("le", "input <= other (torch.le).")
gt, gt_ = _binary("gt", "input > other (torch.gt).")
ge, ge_ = _binary("ge", "input >= other (torch.ge).")
logical_and, logical_and_ = _binary("logical_and", "input and other (torch.logical_and).")
logical_or, logical_or_ = _binary("logical_or", "input or other (torch.logical_or).")
logical_xor, logical_xor_ = _binary("logical_xor", "input xor other (torch.logical_xor).")
bitwise_and, bitwise_and_ = _binary("bitwise_and", "input & other (torch.bitwise_and).")
bitwise_or, bitwise_or_ = _binary("bitwise_or", "input | other (torch.bitwise_or).")
bitwise_xor, bitwise_xor_ = _binary("bitwise_xor", "input ^ other (torch.bitwise_xor).")
bitwise_left_shift, bitwise_left_shift_ = _binary("bitwise_left_shift", "input << other (torch.bitwise_left_shift).")
bitwise_right_shift, bitwise_right_shift_ = _binary(
    "bitwise_right_shift", "input >> other (torch.bitwise_right_shift)."
)
greater, less, greater_equal, less_equal, not_equal = gt, lt, ge, le, ne


def pow(input, exponent, *, out=None):  # noqa: A001 - torch's name
    """input ** exponent (torch.pow). An integer tensor to a negative Python-int power is refused as torch refuses it
    (a negative exponent inside an integer tensor gives torch's 1, +-1 or 0)."""
    integer_base = isinstance(input, _tensor_type()) and _category(input.dtype.name) <= 1  # bool too, as torch
    if integer_base and isinstance(exponent, int) and not isinstance(exponent, bool) and exponent < 0:
        raise DTypeError(f"pow: integers to negative integer powers are not allowed (exponent {exponent})")
    return _apply("pow", [input, exponent], out=out)


def pow_(input, exponent):
    return pow(input, exponent, out=input)


def lerp(input, end, weight, *, out=None):
    """input + weight (end - input) (torch.lerp); weight a tensor or a number."""
    return _apply("lerp", [input, end, weight], out=out)


def lerp_(input, end, weight):
    return lerp(input, end, weight, out=input)


def addcdiv(input, tensor1, tensor2, *, value=1, out=None):
    """input + value * tensor1 / tensor2 (torch.addcdiv)."""
    return _apply("addcdiv", [input, tensor1, tensor2], {"value": value}, out=out)


def addcdiv_(input, tensor1, tensor2, *, value=1):
    return addcdiv(input, tensor1, tensor2, value=value, out=input)


def addcmul(input, tensor1, tensor2, *, value=1, out=None):
    """input + value * tensor1 * tensor2 (torch.addcmul)."""
    return _apply("addcmul", [input, tensor1, tensor2], {"value": value}, out=out)


def addcmul_(input, tensor1, tensor2, *, value=1):
    return addcmul(input, tensor1, tensor2, value=value, out=input)


# ======================================================================================================================
# selection
# ======================================================================================================================
def nan_to_num(input, nan=0.0, posinf=None, neginf=None, *, out=None):
    """NaN, +inf and -inf replaced (torch.nan_to_num; the infinities default to the dtype's extremes)."""
    return _apply("nan_to_num", [input], {"nan": nan, "posinf": posinf, "neginf": neginf}, out=out)


def nan_to_num_(input, nan=0.0, posinf=None, neginf=None):
    return nan_to_num(input, nan, posinf, neginf, out=input)


def clamp(input, min=None, max=None, *, out=None):  # noqa: A002 - torch's names
    """min(max(input, min), max) (torch.clamp); at least one bound; NaN stays NaN."""
    if min is None and max is None:
        raise DTypeError("clamp: at least one of min and max must be given")
    if max is None:
        return _apply("clamp_min", [input], {"min": min}, out=out, promote_params=("min",))
    if min is None:
        return _apply("clamp_max", [input], {"max": max}, out=out, promote_params=("max",))
    return _apply("clamp", [input], {"min": min, "max": max}, out=out, promote_params=("min", "max"))


def clamp_(input, min=None, max=None):  # noqa: A002
    return clamp(input, min, max, out=input)


clip, clip_ = clamp, clamp_


def clamp_min(input, min, *, out=None):  # noqa: A002
    return clamp(input, min=min, out=out)


def clamp_max(input, max, *, out=None):  # noqa: A002
    return clamp(input, max=max, out=out)


def clamp_min_(input, min):  # noqa: A002
    return clamp(input, min=min, out=input)


def clamp_max_(input, max):  # noqa: A002
    return clamp(input, max=max, out=input)


def where(condition, input, other, *, out=None):
    """input where condition holds, other elsewhere (torch.where; condition bool)."""
    return _apply("where", [condition, input, other], out=out)


def masked_fill(input, mask, value, *, out=None):
    """input with value where mask (bool) holds (torch.Tensor.masked_fill)."""
    return _apply("masked_fill", [input, mask], {"value": value}, out=out)


def masked_fill_(input, mask, value):
    return masked_fill(input, mask, value, out=input)


# ======================================================================================================================
# activations (torch.nn.functional's names)
# ======================================================================================================================
def relu(input, inplace: bool = False):
    """max(input, 0), NaN kept (F.relu)."""
    return _apply("relu", [input], out=input if inplace else None)


def relu_(input):
    return relu(input, inplace=True)


def gelu(input, approximate: str = "none"):
    """GELU (F.gelu): the erf form, or approximate="tanh"."""
    if approximate not in ("none", "tanh"):
        raise DTypeError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _apply("gelu" if approximate == "none" else "gelu_tanh", [input])


def _act(name: str, doc: str, params: tuple = ()):
    def fn(input, *args, inplace: bool = False, **kwargs):
        values = dict(params)
        for (key, _), v in zip(params, args, strict=False):
            values[key] = v
        for key, v in kwargs.items():
            if key not in values:
                raise DTypeError(f"{name}() got an unexpected keyword argument '{key}'")
            values[key] = v
        return _apply(name, [input], values, out=input if inplace else None)

    def fn_(input, *args, **kwargs):
        return fn(input, *args, inplace=True, **kwargs)

    fn.__name__, fn.__qualname__, fn.__doc__ = name, name, doc
    fn_.__name__, fn_.__qualname__ = name + "_", name + "_"
    return fn, fn_


silu, silu_ = _act("silu", "input * sigmoid(input) (F.silu).")
mish, mish_ = _act("mish", "input * tanh(softplus(input)) (F.mish).")
elu, elu_ = _act("elu", "input, or alpha (e^input - 1) below 0 (F.elu).", (("alpha", 1.0),))
celu, celu_ = _act("celu", "max(0, x) + min(0, alpha (e^(x/alpha) - 1)) (F.celu).", (("alpha", 1.0),))
selu, selu_ = _act("selu", "scale (x, or alpha (e^x - 1) below 0) (F.selu).")
leaky_relu, leaky_relu_ = _act(
    "leaky_relu", "x, or negative_slope x below 0 (F.leaky_relu).", (("negative_slope", 0.01),)
)
hardsigmoid, hardsigmoid_ = _act("hardsigmoid", "clamp(x + 3, 0, 6) / 6 (F.hardsigmoid).")
hardswish, hardswish_ = _act("hardswish", "x clamp(x + 3, 0, 6) / 6 (F.hardswish).")
threshold, threshold_ = _act(
    "threshold", "value where x <= threshold, else x (F.threshold).", (("threshold", 0.0), ("value", 0.0))
)


def softplus(input, beta: float = 1.0, threshold: float = 20.0):
    """log(1 + e^(beta x)) / beta, x where beta x > threshold (F.softplus)."""
    return _apply("softplus", [input], {"beta": beta, "threshold": threshold})


def logsigmoid(input):
    """log(sigmoid(x)) (F.logsigmoid)."""
    return _apply("log_sigmoid", [input])


log_sigmoid = logsigmoid


def glu(input, dim: int = -1):
    """a * sigmoid(b), a and b the halves of input along dim (F.glu)."""
    d = dim % input.ndim if input.ndim else 0
    size = input.shape[d]
    if size % 2:
        raise ShapeMismatch(f"glu: halving dimension {dim} must be even, got size {size}")
    half = size // 2
    lead = (slice(None),) * d
    return _apply("glu", [input[lead + (slice(0, half),)], input[lead + (slice(half, size),)]])


# ======================================================================================================================
# data movement
# ======================================================================================================================
def _size(size: tuple) -> tuple[int, ...]:
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    return tuple(int(s) for s in size)


def _fill_new(shape, value, dtype, device, out):
    pw = _pw()
    if out is None:
        out = pw.empty(shape, pw.get_dtype(dtype).name, device)
    return _fill(out, value)


def _fill(t, value):
    pw = _pw()
    op = pw.OPS["fill"]
    d = t.dtype.name
    pw.check_dtype(op, d)
    via, compute, kparams, p_float = pw.plan_for(op, [], d, t, {"value": value})
    return pw.pointwise_call("fill", None, None, None, t, via, compute, kparams, p_float)


def zeros(*size, dtype="float32", device="cpu", out=None):
    """A tensor of zeros (torch.zeros)."""
    return _fill_new(_size(size), 0, dtype, device, out)


def ones(*size, dtype="float32", device="cpu", out=None):
    """A tensor of ones (torch.ones)."""
    return _fill_new(_size(size), 1, dtype, device, out)


def full(size, fill_value, *, dtype=None, device="cpu", out=None):
    """A tensor of fill_value (torch.full: the dtype defaults to the value's: bool, int64 or float32)."""
    if dtype is None:
        dtype = "bool" if isinstance(fill_value, bool) else "int64" if isinstance(fill_value, int) else "float32"
    return _fill_new(_size((size,)), fill_value, dtype, device, out)


def zeros_like(input, *, dtype=None):
    return zeros(input.shape, dtype=dtype or input.dtype.name, device=input.device)


def ones_like(input, *, dtype=None):
    return ones(input.shape, dtype=dtype or input.dtype.name, device=input.device)


def full_like(input, fill_value, *, dtype=None):
    return full(input.shape, fill_value, dtype=dtype or input.dtype.name, device=input.device)


def fill_(input, value):
    """input with every element value (torch.Tensor.fill_)."""
    return _fill(input, value)


def zero_(input):
    return _fill(input, 0)


def arange(start, end=None, step=1, *, dtype=None, device="cpu", out=None):
    """start, start + step, ... below end (torch.arange; one argument: 0 .. start)."""
    if end is None:
        start, end = 0, start
    if step == 0:
        raise DTypeError("arange: step must be nonzero")
    n = max(0, math.ceil((end - start) / step))
    if dtype is None:
        dtype = "int64" if all(isinstance(v, int) for v in (start, end, step)) else "float32"
    pw = _pw()
    if out is None:
        out = pw.empty((n,), pw.get_dtype(dtype).name, device)
    elif tuple(out.shape) != (n,):
        raise ShapeMismatch(f"arange: out has shape {tuple(out.shape)}, the result's is ({n},)")
    op = pw.OPS["arange"]
    pw.check_dtype(op, out.dtype.name)
    via, compute, kparams, p_float = pw.plan_for(op, [], out.dtype.name, out, {"start": start, "step": step})
    return pw.pointwise_call("arange", None, None, None, out, via, compute, kparams, p_float)


def linspace(start, end, steps, *, dtype="float32", device="cpu", out=None):
    """steps values from start to end (torch.linspace)."""
    pw = _pw()
    if out is None:
        out = pw.empty((int(steps),), pw.get_dtype(dtype).name, device)
    elif tuple(out.shape) != (int(steps),):
        raise ShapeMismatch(f"linspace: out has shape {tuple(out.shape)}, the result's is ({int(steps)},)")
    op = pw.OPS["linspace"]
    pw.check_dtype(op, out.dtype.name)
    via, compute, kparams, p_float = pw.plan_for(op, [], out.dtype.name, out, {"start": start, "end": end})
    return pw.pointwise_call("linspace", None, None, None, out, via, compute, kparams, p_float)


def _cast_into(src, out):
    pw = _pw()
    name = "copy" if src.dtype is out.dtype else "cast"
    op = pw.OPS[name]
    if tuple(pw.broadcast_shapes(src.shape, out.shape)) != tuple(out.shape):
        raise ShapeMismatch(f"copy_: source shape {tuple(src.shape)} does not broadcast to {tuple(out.shape)}")
    via, compute, kparams, p_float = pw.plan_for(op, [src], src.dtype.name, out, {})
    return pw.pointwise_call(name, src, None, None, out, via, compute, kparams, p_float)


def copy_(input, src):
    """src's values written into input, any strides, broadcast, cast to input's dtype (torch.Tensor.copy_)."""
    return _cast_into(src, input)


def clone(input):
    """A contiguous copy (torch.clone)."""
    return _cast_into(input, _pw().empty(input.shape, input.dtype.name, input.device))


def to(input, dtype):
    """input cast to dtype (torch.Tensor.to(dtype)): floats to integers truncate toward zero (NaN, infinities and
    values out of range refused), anything to bool is != 0."""
    pw = _pw()
    target = pw.get_dtype(dtype).name
    return _cast_into(input, pw.empty(input.shape, target, input.device))


cast = to
