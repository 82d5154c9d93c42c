"""File formats: the strict JSON reader, the schemas, the result record, store and
journal, the child protocol, the barrier's wire format. The lowest layer above
``errors``."""
