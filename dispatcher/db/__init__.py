"""Database access: the only package that imports asyncpg."""
