"""The bottom floor of ``core``: plain value types every other floor may import (stored rows as
immutable copies, the request profile's values, number and size limits). Nothing here imports
another ``core`` module but ``core.errors``."""
