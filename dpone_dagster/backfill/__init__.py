"""Ordered, checkpointed backfill: protocol (pure), ledger (PostgreSQL), copier. No Dagster."""
