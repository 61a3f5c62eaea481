"""PySpark data source and sink that read only confirmed offsets."""
