"""What a record keeps of the tensors a collective was given: shapes and dtypes, never the data."""

from __future__ import annotations

from ..format import build


def describe_tensors(tensors) -> tuple:
    """(shapes as lists, dtype names without "torch.") of what tensor_meta kept."""
    shapes, dtypes = [], []
    for shape, dtype in tensors or ():
        shapes.append(list(shape))
        dtypes.append(str(dtype).replace("torch.", ""))
    return shapes, dtypes


def tensor_meta(value, limit: int = build.TENSORS_KEPT) -> tuple:
    """(shape, dtype) pairs for a tensor or a list of tensors, at most `limit`; holds no reference to the data.

    The shape is kept as the torch.Size it is (immutable, no data): copying it into a tuple costs 0.1 us per call.
    """
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(
            (item.shape, item.dtype) for item in value[:limit] if hasattr(item, "shape") and hasattr(item, "dtype")
        )
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    return () if shape is None or dtype is None else ((shape, dtype),)
