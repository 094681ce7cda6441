"""Database backends of the composition app (``ENGINE = "composition.db.postgresql"``)."""
