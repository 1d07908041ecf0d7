"""Generic source adapters (MySQL/MariaDB, REST): honest receipts, no snapshot claims."""
