package io.tidelog.spark;

import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.types.StructType;

/**
 * One batch scan of the plan: a Spark partition per planned range, read columnar. The ranges were
 * frozen when the DataFrame was made, so a retried task or a second action reads the same rows.
 */
final class DataPortScan implements Scan, Batch {
  private final ReadPlan plan;
  private final StructType readSchema;

  DataPortScan(ReadPlan plan, StructType readSchema) {
    this.plan = plan;
    this.readSchema = readSchema;
  }

  @Override
  public StructType readSchema() {
    return readSchema;
  }

  @Override
  public String description() {
    return "tidelog data-port scan of " + plan.describe();
  }

  @Override
  public Batch toBatch() {
    return this;
  }

  @Override
  public InputPartition[] planInputPartitions() {
    return plan.partitions.toArray(new InputPartition[0]);
  }

  @Override
  public PartitionReaderFactory createReaderFactory() {
    return new DataPortReaderFactory(plan.settings, readSchema);
  }
}
