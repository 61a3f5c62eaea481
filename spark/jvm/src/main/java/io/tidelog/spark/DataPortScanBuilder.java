package io.tidelog.spark;

import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.types.StructType;

/** Takes the columns a query needs (column pruning), so that the readers build only those. */
final class DataPortScanBuilder implements ScanBuilder, SupportsPushDownRequiredColumns {
  private final ReadPlan plan;
  private StructType required;

  DataPortScanBuilder(StructType schema, ReadPlan plan) {
    this.plan = plan;
    this.required = schema;
  }

  @Override
  public void pruneColumns(StructType requiredSchema) {
    Columns.check(requiredSchema);
    this.required = requiredSchema;
  }

  @Override
  public Scan build() {
    return new DataPortScan(plan, required);
  }
}
