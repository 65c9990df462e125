"""A record's per-token values held as machine numbers: 8 bytes a value, not a Python object.

A record read from records.jsonl carries its inter-token times and output ids as lists of
Python floats and ints (about 32 and 36 bytes a value with the list's pointer): at 10^5
records of a few hundred tokens, gigabytes. :class:`Packed` holds them in an
:class:`array.array` and reads as the list it replaces: the same length, items, iteration,
equality with lists, ``repr`` and JSON; it cannot be changed (records are read, not edited).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, SupportsIndex, TypeVar, overload

if TYPE_CHECKING:  # numpy only where a value is read as an array (records load at startup)
    import numpy as np

T = TypeVar("T", int, float)

_INT64 = (-(2**63), 2**63 - 1)


class Packed(Sequence[T]):
    """An immutable list of floats (typecode ``d``) or ints (``q``) in one buffer."""

    __slots__ = ("_values",)
    __hash__ = None  # type: ignore[assignment]  # as a list: equal to one, so unhashable

    def __init__(self, values: array[Any]) -> None:
        self._values = values

    @overload
    def __getitem__(self, i: SupportsIndex) -> T: ...
    @overload
    def __getitem__(self, i: slice) -> list[T]: ...
    def __getitem__(self, i: SupportsIndex | slice) -> T | list[T]:
        if isinstance(i, slice):  # a slice is a list, as a list's is
            return self._values[i].tolist()
        value: T = self._values[i]
        return value

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Iterator[T]:
        return iter(self._values)

    def __contains__(self, value: object) -> bool:
        return value in self._values

    def tolist(self) -> list[T]:
        return self._values.tolist()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Packed):
            return self._values == other._values
        if isinstance(other, list):
            return self.tolist() == other
        return NotImplemented  # a tuple is not equal to a list either

    def __add__(self, other: list[T] | Packed[T]) -> list[T]:
        if isinstance(other, Packed | list):
            return self.tolist() + list(other)
        return NotImplemented

    def __radd__(self, other: list[T]) -> list[T]:
        if isinstance(other, list):
            return other + self.tolist()
        return NotImplemented

    def __repr__(self) -> str:
        return repr(self.tolist())

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray[Any, Any]:
        import numpy as np

        out = np.frombuffer(self._values, dtype=self._values.typecode).copy()
        return out if dtype is None else out.astype(dtype)

    def __copy__(self) -> Packed[T]:
        return self  # immutable: a copy is itself, as a deep one

    def __deepcopy__(self, memo: dict[int, Any]) -> Packed[T]:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return Packed, (self._values,)

    def unusual(self, counts: bool) -> bool:
        """Whether any value is not finite, or negative (``counts``: any is negative; ints
        are finite): the question records.impossible_value asks of every value, at once."""
        if counts and self._values.typecode != "q":
            return True  # a count that is a float: said value by value
        import numpy as np

        values = np.frombuffer(self._values, dtype=self._values.typecode)
        if counts:
            return bool(values.size and values.min() < 0)
        return not bool(np.isfinite(values).all() and (values >= 0).all())


def pack(values: Any) -> Any:
    """``values`` as a :class:`Packed` where it is a list of floats only or of ints only (no
    bool) that int64 holds; anything else (a mixed list, None, a huge int) as it is, so that
    what reads it meets exactly what was read."""
    if not isinstance(values, list) or not values:
        return values
    kinds = set(map(type, values))
    if kinds == {float}:
        return Packed(array("d", values))
    if kinds == {int} and _INT64[0] <= min(values) and max(values) <= _INT64[1]:
        return Packed(array("q", values))
    return values
