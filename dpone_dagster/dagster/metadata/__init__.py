"""What a materialization, an observation and a check say: dpone's receipts in Dagster's
vocabulary (:mod:`.receipts`) and the standard table set read from the target's catalog
(:mod:`.catalog`)."""
