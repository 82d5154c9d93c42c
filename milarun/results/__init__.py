"""Result records: schema, format version, migrations and on-disk store."""

from .schema import FORMAT_VERSION, migrate, new_result, validate  # noqa: F401
from .store import iter_results, result_filename, write_result  # noqa: F401
