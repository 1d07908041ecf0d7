"""The engines' durable documents: frozen, strict pydantic models, and the numbers they hold.

A run, a stream's state, a batch receipt or a range check is a :class:`Document`: frozen (a new
state is a new document, so no reader ever sees one change) and refusing unknown fields (a
ledger row written by another release fails to parse instead of losing what it held).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class Document(BaseModel):
    """A frozen document that refuses unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")


Count = Annotated[int, Field(ge=0)]
"""How many (rows, bytes, batches, keys): zero or more."""
Ordinal = Annotated[int, Field(ge=1)]
"""A position counted from one (a sequence number, a revision, a run's number, a size)."""
