"""The job record and the profile language (include, inherits, matrix, placeholders)."""
