"""The demo: a source database to copy from and a target to copy into."""
