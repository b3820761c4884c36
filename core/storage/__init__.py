"""Storage: the schema, engines, migrations, and every read and write of the database."""
