package io.tidelog.spark;

import java.util.EnumSet;
import java.util.Set;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/** The planned ranges as a table that can only be read, in batch (streaming stays on the Python source). */
final class DataPortTable implements SupportsRead {
  private final StructType schema;
  private final ReadPlan plan;

  DataPortTable(StructType schema, ReadPlan plan) {
    this.schema = schema;
    this.plan = plan;
  }

  @Override
  public String name() {
    return "tidelog-dataport " + plan.describe();
  }

  @Override
  @SuppressWarnings("deprecation") // Spark 4 still asks for it (columns() is derived from it)
  public StructType schema() {
    return schema;
  }

  @Override
  public Set<TableCapability> capabilities() {
    return EnumSet.of(TableCapability.BATCH_READ);
  }

  @Override
  public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
    return new DataPortScanBuilder(schema, plan);
  }
}
