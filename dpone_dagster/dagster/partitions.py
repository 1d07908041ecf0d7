"""Partitions for backfills: integer cursor ranges, and Dagster time windows for timestamps."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

import dagster as dg

from dpone_dagster.lifecycle import DponeError

_RANGE_KEY = re.compile(r"^(-?\d+)\.\.(-?\d+)$")
_MICROSECOND = timedelta(microseconds=1)


class PartitionError(DponeError):
    """A partition key or definition that cannot describe a cursor range."""


def cursor_range_partitions(start: int, stop: int, step: int) -> dg.StaticPartitionsDefinition:
    """Static partitions whose keys encode integer cursor ranges.

    ``cursor_range_partitions(0, 250, 100)`` has keys ``0..100``, ``100..200``, ``200..250``:
    partition ``lo..hi`` holds the rows with ``lo < cursor <= hi`` (so ids counted from 1 fall
    in ``0..100`` first, and the last key's ``hi`` is the largest id covered).

    Args:
        start: The lower (exclusive) bound of the first range.
        stop: The upper (inclusive) bound of the last range.
        step: The width of each range.

    Raises:
        PartitionError: ``plan_invalid`` when the range is empty or the step is not positive.

    Examples:
        >>> cursor_range_partitions(0, 250, 100).get_partition_keys()
        ['0..100', '100..200', '200..250']
    """
    if step <= 0 or stop <= start:
        raise PartitionError(
            "plan_invalid",
            f"cursor_range_partitions({start}, {stop}, {step}) describes no range.",
            ["Use start < stop and a positive step."],
        )
    keys = [f"{lo}..{min(lo + step, stop)}" for lo in range(start, stop, step)]
    return dg.StaticPartitionsDefinition(keys)


@dataclass(frozen=True)
class CursorRange:
    """The cursor range ``lower < cursor <= upper`` that one partition covers."""

    lower: int | datetime
    upper: int | datetime


def parse_range_key(key: str) -> CursorRange:
    """Reads a ``lo..hi`` partition key.

    Raises:
        PartitionError: ``plan_invalid`` for a key that does not encode a range.
    """
    match = _RANGE_KEY.match(key)
    if not match or int(match.group(1)) >= int(match.group(2)):
        raise PartitionError(
            "plan_invalid",
            f"Partition key {key!r} does not encode an integer cursor range lo..hi (lo < hi).",
            ["Build the partitions with cursor_range_partitions(start, stop, step)."],
        )
    return CursorRange(int(match.group(1)), int(match.group(2)))


def partition_cursor_range(partitions_def: dg.PartitionsDefinition, key: str) -> CursorRange:
    """The cursor range of one partition: integer range keys, or a time window.

    A time window ``[start, end)`` becomes ``start - 1µs < cursor <= end - 1µs``: PostgreSQL
    timestamps have microsecond resolution, so both describe the same rows.
    """
    if isinstance(partitions_def, dg.TimeWindowPartitionsDefinition):
        window = partitions_def.time_window_for_partition_key(key)
        return CursorRange(window.start - _MICROSECOND, window.end - _MICROSECOND)
    return parse_range_key(key)
