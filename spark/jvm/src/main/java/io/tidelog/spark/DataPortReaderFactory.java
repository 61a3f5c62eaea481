package io.tidelog.spark;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/** Sent to the executors: makes a columnar reader for each planned range (rows are never read one by one). */
final class DataPortReaderFactory implements PartitionReaderFactory {
  private static final long serialVersionUID = 1L;

  private final ReadSettings settings;
  private final StructType schema;

  DataPortReaderFactory(ReadSettings settings, StructType schema) {
    this.settings = settings;
    this.schema = schema;
  }

  @Override
  public boolean supportColumnarReads(InputPartition partition) {
    return true;
  }

  @Override
  public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
    return new ColumnarRangeReader((RangePartition) partition, settings, schema);
  }

  @Override
  public PartitionReader<InternalRow> createReader(InputPartition partition) {
    throw new UnsupportedOperationException("the tidelog data-port reader reads columnar batches only");
  }
}
