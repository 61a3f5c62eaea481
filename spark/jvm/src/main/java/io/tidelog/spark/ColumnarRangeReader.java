package io.tidelog.spark;

import java.io.IOException;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/** One task's reader: a batch per chunk of its range, until the range is read. */
final class ColumnarRangeReader implements PartitionReader<ColumnarBatch> {
  private final RangeReader range;
  private final BatchBuilder builder;
  private ColumnarBatch current;

  ColumnarRangeReader(RangePartition partition, ReadSettings settings, StructType schema) {
    this.range = new RangeReader(partition, settings);
    this.builder = new BatchBuilder(schema, partition, settings.fetchMaxMessages);
  }

  @Override
  public boolean next() throws IOException {
    RecordChunk chunk = range.next();
    if (chunk == null) {
      return false;
    }
    current = builder.build(chunk);
    return true;
  }

  @Override
  public ColumnarBatch get() {
    return current;
  }

  @Override
  public void close() {
    range.close();
    builder.close();
  }
}
